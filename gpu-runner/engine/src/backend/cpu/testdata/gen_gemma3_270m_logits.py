# Regenerates gemma3_270m_llamacpp.json: llama.cpp's top-5 log-probs at every position of a
# fixed token sequence for models/gemma-3-270m-Q4_K_M.gguf (same layout as the "steps" of
# tests/fixtures/smollm2_logits.json). Run with a Python that has llama-cpp-python and numpy.
import json, sys, numpy as np, llama_cpp
model = sys.argv[1] if len(sys.argv) > 1 else "models/gemma-3-270m-Q4_K_M.gguf"
toks = [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107]
llm = llama_cpp.Llama(model_path=model, logits_all=True, n_ctx=256, verbose=False)
llm.eval(toks)
steps = []
for row in np.array(llm.scores[:len(toks)], dtype=np.float64):
    m = row.max(); logp = row - m - np.log(np.exp(row - m).sum())
    order = np.argsort(-row)[:5]
    steps.append({"token": int(order[0]), "gap": round(float(row[order[0]] - row[order[1]]), 5),
                  "top": [[int(i), round(float(logp[i]), 5)] for i in order]})
out = {"generator": "llama-cpp-python " + llama_cpp.__version__, "tokens": toks, "steps": steps}
json.dump(out, open(__file__.rsplit("/", 1)[0] + "/gemma3_270m_llamacpp.json", "w"), separators=(",", ":"))
