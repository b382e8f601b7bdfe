"""LoRA adapters over one warm base model: `--lora NAME=PATH` adapters asked for as
`BASE:NAME` or `NAME`, SGLang's `lora_path` inside `--lora-dir`, several adapters and the base
mixed in one batch, and the refusals. The adapters are random (`fallow bench random-lora`)
over the default model, made for each run."""

import json
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import FALLOW, MODEL_ID, MODEL_PATH, ROOT, Stack

TINY_LLAMA = ROOT / "gpu-runner" / "engine" / "tests" / "fixtures" / "tiny" / "llama"
ASK = [{"role": "user", "content": "Write one sentence about the sea."}]
# Each adapter's own seed; "zero" has B = 0 and must change nothing.
SEEDS = {"sql": 1, "a": 2, "b": 3, "team/style": 4}


def random_lora(out, model=MODEL_PATH, seed=1, strength=1.0):
    subprocess.run([FALLOW, "bench", "random-lora", "--model", str(model), "--out", str(out),
                    "--rank", "8", "--seed", str(seed), "--strength", str(strength)],
                   check=True, capture_output=True, cwd=ROOT)


@pytest.fixture(scope="module")
def loras(tmp_path_factory):
    root = tmp_path_factory.mktemp("loras")
    lora_dir = root / "dir"
    for name, seed in SEEDS.items():
        random_lora(lora_dir / name, seed=seed)
    random_lora(lora_dir / "zero", strength=0.0)
    # An adapter for another shape (the tiny Llama fixture), and a corrupt weights file.
    random_lora(lora_dir / "tiny", model=TINY_LLAMA)
    shutil.copytree(lora_dir / "sql", lora_dir / "corrupt")
    (lora_dir / "corrupt" / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    # Outside the lora dir, reachable only through a link that leads out.
    random_lora(root / "outside", seed=9)
    (lora_dir / "escape").symlink_to(root / "outside")
    return lora_dir


@pytest.fixture(scope="module")
def lora_stack(loras):
    args = []
    for name in ["sql", "a", "b", "zero", "corrupt"]:
        args += ["--lora", f"{name}={loras / name}"]
    args += ["--lora", f"style={loras / 'team/style'};base={MODEL_ID}", "--lora-dir", str(loras)]
    stack = Stack(*args).start()
    yield stack
    stack.stop()


@pytest.fixture(scope="module")
def client(lora_stack):
    return openai.OpenAI(base_url=f"{lora_stack.base_url}/v1", api_key="x", max_retries=0, timeout=180)


def answer(client, model, messages=ASK, max_tokens=24, **extra):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                       temperature=0, **extra)
    return r.choices[0].message.content


def metric(stack, name, **labels):
    total = 0.0
    for line in httpx.get(f"{stack.base_url}/metrics", timeout=30).text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_models_lists_each_adapter_with_its_base_as_parent(client):
    models = {m.id: m for m in client.models.list().data}
    assert getattr(models[MODEL_ID], "parent", None) is None
    for name in ["sql", "a", "b", "zero", "style"]:
        assert getattr(models[f"{MODEL_ID}:{name}"], "parent") == MODEL_ID
    assert client.models.retrieve("sql").id == f"{MODEL_ID}:sql", "a bare adapter name resolves"


def test_an_adapter_changes_the_answer_and_is_asked_for_by_either_name(client):
    base = answer(client, MODEL_ID)
    adapted = answer(client, f"{MODEL_ID}:sql")
    assert adapted != base, "a random rank-8 adapter must move the greedy answer"
    assert answer(client, "sql") == adapted


def test_an_adapter_with_b_zero_gives_exactly_the_bases_logprobs(client):
    def logprobs(model):
        r = client.chat.completions.create(model=model, messages=ASK, max_tokens=12, temperature=0,
                                           logprobs=True, top_logprobs=5)
        return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs])
                for t in r.choices[0].logprobs.content]
    assert logprobs(f"{MODEL_ID}:zero") == logprobs(MODEL_ID)


def test_sixteen_mixed_streams_each_get_what_they_get_alone(client):
    models = [MODEL_ID, f"{MODEL_ID}:sql", f"{MODEL_ID}:a", f"{MODEL_ID}:b"]
    prompts = [[{"role": "user", "content": f"Name {i + 2} colours."}] for i in range(16)]
    cases = [(models[i % 4], prompts[i]) for i in range(16)]
    alone = [answer(client, m, p, max_tokens=16) for m, p in cases]
    assert len({alone[i] for i in range(0, 4)}) == 4, "each adapter answers differently"

    def streamed(case):
        model, messages = case
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=16,
                                                temperature=0, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(streamed, cases))
    assert together == alone


def test_a_lora_path_inside_the_lora_dir_is_served_like_the_named_adapter(client):
    by_path = answer(client, MODEL_ID, extra_body={"lora_path": "team/style"})
    assert by_path == answer(client, f"{MODEL_ID}:style")
    assert by_path != answer(client, MODEL_ID)
    completion = client.completions.create(model=MODEL_ID, prompt="The sea is", max_tokens=8,
                                           temperature=0, extra_body={"lora_path": "team/style"})
    base = client.completions.create(model=MODEL_ID, prompt="The sea is", max_tokens=8, temperature=0)
    assert completion.choices[0].text != base.choices[0].text


@pytest.mark.parametrize("path", ["../outside", "/etc", "escape", "missing", "team/../../outside"])
def test_a_lora_path_outside_the_lora_dir_is_refused_with_400(client, path):
    with pytest.raises(openai.BadRequestError) as e:
        answer(client, MODEL_ID, extra_body={"lora_path": path})
    assert "lora" in str(e.value).lower(), e.value


def test_an_unknown_adapter_is_404_and_a_mismatched_one_400(client):
    with pytest.raises(openai.NotFoundError):
        answer(client, f"{MODEL_ID}:nope")
    with pytest.raises(openai.BadRequestError) as e:
        answer(client, MODEL_ID, extra_body={"lora_path": "tiny"})
    assert "tiny" in str(e.value), e.value


def test_a_corrupt_adapter_fails_cleanly_and_the_runner_keeps_serving(client):
    with pytest.raises(openai.BadRequestError) as e:
        answer(client, f"{MODEL_ID}:corrupt")
    assert "could not be loaded" in str(e.value), e.value
    assert answer(client, MODEL_ID, max_tokens=4)
    assert answer(client, f"{MODEL_ID}:sql", max_tokens=4)


def test_adapter_loads_and_the_adapters_held_are_metrics(lora_stack, client):
    answer(client, f"{MODEL_ID}:a", max_tokens=2)
    assert metric(lora_stack, "fallow:lora_loads_total", model_name=f"{MODEL_ID}:a") == 1, \
        "read once, then served from memory"
    answer(client, f"{MODEL_ID}:a", max_tokens=2)
    assert metric(lora_stack, "fallow:lora_loads_total", model_name=f"{MODEL_ID}:a") == 1
    assert metric(lora_stack, "fallow:lora_active") >= 1


def run_batch(client, lines):
    content = ("\n".join(json.dumps(l) for l in lines) + "\n").encode()
    f = client.files.create(file=("loras.jsonl", content, "application/jsonl"), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.time() + 240
    while batch.status not in {"completed", "failed", "expired", "cancelled"}:
        assert time.time() < deadline, batch
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    return batch


def test_batch_lines_may_name_adapters(client):
    asked = [(MODEL_ID, {}), (f"{MODEL_ID}:sql", {}), (MODEL_ID, {"lora_path": "team/style"}),
             (f"{MODEL_ID}:nope", {})]
    lines = [{"custom_id": f"l-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": model, "messages": ASK, "max_tokens": 12, "temperature": 0, **extra}}
             for i, (model, extra) in enumerate(asked)]
    batch = run_batch(client, lines)
    assert batch.status == "failed", "a line names an adapter no runner serves"
    assert "nope" in json.dumps(batch.errors.model_dump()), batch.errors

    lines[3]["body"]["model"] = f"{MODEL_ID}:b"
    batch = run_batch(client, lines)
    assert batch.status == "completed", batch
    out = [json.loads(l) for l in client.files.content(batch.output_file_id).text.splitlines()]
    by_id = {l["custom_id"]: l["response"]["body"]["choices"][0]["message"]["content"] for l in out}
    alone = [answer(client, model, max_tokens=12) for model in
             [MODEL_ID, f"{MODEL_ID}:sql", f"{MODEL_ID}:style", f"{MODEL_ID}:b"]]
    assert [by_id[f"l-{i}"] for i in range(4)] == alone


def test_an_adapter_an_operator_loads_is_served_until_unloaded(lora_stack, client):
    admin = ["--url", lora_stack.base_url]
    out = subprocess.run([FALLOW, "admin", "loras", "load", "ops", "--base", MODEL_ID,
                          "--path", "team/style", "--json", *admin],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    loaded = json.loads(out.stdout)
    assert (loaded["id"], loaded["source"], loaded["served"]) == (f"{MODEL_ID}:ops", "admin", True)
    assert answer(client, f"{MODEL_ID}:ops") == answer(client, f"{MODEL_ID}:style")
    models = {m.id: m for m in client.models.list().data}
    assert getattr(models[f"{MODEL_ID}:ops"], "parent") == MODEL_ID
    listing = subprocess.run([FALLOW, "admin", "loras", "list", *admin],
                             check=True, capture_output=True, text=True, cwd=ROOT).stdout
    assert f"{MODEL_ID}:ops" in listing and f"{MODEL_ID}:sql" in listing, listing

    bad = httpx.post(f"{lora_stack.base_url}/admin/loras", timeout=30,
                     json={"name": "x", "base": MODEL_ID, "path": "../outside"})
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "path")

    subprocess.run([FALLOW, "admin", "loras", "unload", f"{MODEL_ID}:ops", *admin],
                   check=True, capture_output=True, cwd=ROOT)
    with pytest.raises(openai.NotFoundError):
        answer(client, f"{MODEL_ID}:ops")
    again = httpx.post(f"{lora_stack.base_url}/admin/loras/{MODEL_ID}:ops/unload", timeout=30)
    assert again.status_code == 404
