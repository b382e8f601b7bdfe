# Regenerates tiny_llamacpp_logits.json: llama.cpp's logits for the tiny random models of
# engine::model::tiny (seed 11). First write them:
#   FALLOW_TINY_DIR=/tmp/tiny cargo test -p fallow-runner --lib write_tiny_models -- --ignored
# then run this with a Python that has llama-cpp-python and numpy.
import json, numpy as np, llama_cpp
toks = [1, 17, 42, 5, 88, 63, 9, 31, 70, 2, 54]
out = {"generator": "llama-cpp-python " + llama_cpp.__version__, "seed": 11, "tokens": toks, "logits": {}}
for name in ["llama", "qwen2", "qwen3", "gemma3"]:
    llm = llama_cpp.Llama(model_path=f"/tmp/tiny/{name}/model.gguf", logits_all=True, n_ctx=64, verbose=False)
    llm.eval(toks)
    ref = np.array(llm.scores[:len(toks)], dtype=np.float32)
    out["logits"][name] = [[round(float(v), 5) for v in row] for row in ref]
json.dump(out, open(__file__.rsplit("/", 1)[0] + "/tiny_llamacpp_logits.json", "w"), separators=(",", ":"))
