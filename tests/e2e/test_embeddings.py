"""Embeddings with the official SDK against a stack serving all-MiniLM-L6-v2 (and the default
chat model): the vectors match sentence-transformers' within cosine 0.999, a batch of 64
equals the inputs one at a time, base64 equals float, `dimensions` is refused for a model
without Matryoshka support, each kind of model refuses the other's endpoint, and an
embeddings batch runs through Files and Batches."""

import base64
import io
import json
import math
import struct
import time

import openai
import pytest

from conftest import MINILM_ID, MODEL_ID, ROOT

REFERENCE = ROOT / "gpu-runner" / "engine" / "tests" / "fixtures" / "minilm_embeddings.json"


@pytest.fixture(scope="module")
def client(embedding_stack):
    return openai.OpenAI(base_url=f"{embedding_stack.base_url}/v1", api_key="x", max_retries=0, timeout=120)


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def reference():
    """sentence-transformers' texts, token ids and vectors (scripts/make_embedding_fixtures.py)."""
    cases = json.loads(REFERENCE.read_text())["cases"]
    return [c["text"] for c in cases], [c["embedding"] for c in cases]


def test_the_model_is_listed_as_an_embedding_model(client):
    models = {m.id: m for m in client.models.list().data}
    assert models[MINILM_ID].model_extra["kind"] == "embedding"
    assert models[MINILM_ID].model_extra["dimensions"] == 384
    assert models[MODEL_ID].model_extra["kind"] == "chat"


def test_vectors_match_sentence_transformers(client):
    texts, expected = reference()
    answer = client.embeddings.create(model=MINILM_ID, input=texts, encoding_format="float")
    assert answer.model == MINILM_ID
    assert [d.index for d in answer.data] == list(range(len(texts)))
    for text, got, want in zip(texts, answer.data, expected):
        assert len(got.embedding) == 384
        assert cosine(got.embedding, want) >= 0.999, text
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts)


def test_a_batch_of_64_equals_the_inputs_one_at_a_time(client):
    texts = [f"Sentence number {i} is about {'cats' if i % 2 else 'the sea'}." for i in range(64)]
    together = client.embeddings.create(model=MINILM_ID, input=texts, encoding_format="float").data
    assert len(together) == 64
    for i in (0, 1, 31, 63):
        alone = client.embeddings.create(model=MINILM_ID, input=texts[i], encoding_format="float").data[0]
        assert cosine(alone.embedding, together[i].embedding) > 0.99999


def test_base64_equals_float_and_the_sdk_default_decodes(client):
    floats = client.embeddings.create(model=MINILM_ID, input="hello", encoding_format="float").data[0].embedding
    raw = client.with_raw_response.embeddings.create(model=MINILM_ID, input="hello", encoding_format="base64")
    encoded = json.loads(raw.text)["data"][0]["embedding"]
    decoded = struct.unpack(f"<{len(floats)}f", base64.b64decode(encoded))
    assert list(decoded) == pytest.approx(floats, abs=1e-7)
    # The SDK asks for base64 by default and decodes it itself.
    default = client.embeddings.create(model=MINILM_ID, input="hello").data[0].embedding
    assert default == pytest.approx(floats, abs=1e-7)


def test_token_id_inputs_embed_like_their_text(client):
    _, expected = reference()
    ids = json.loads(REFERENCE.read_text())["cases"][0]["ids"]
    answer = client.embeddings.create(model=MINILM_ID, input=[ids], encoding_format="float")
    assert cosine(answer.data[0].embedding, expected[0]) >= 0.999


def test_dimensions_is_refused_for_a_model_without_matryoshka_support(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MINILM_ID, input="hi", dimensions=128)
    assert refused.value.body["param"] == "dimensions"


def test_each_kind_of_model_refuses_the_others_endpoint(client):
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MINILM_ID, messages=[{"role": "user", "content": "hi"}])
    assert chat.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as embed:
        client.embeddings.create(model=MODEL_ID, input="hi")
    assert embed.value.body["param"] == "model"


def test_an_over_long_input_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=MINILM_ID, input="word " * 2000)
    assert "at most" in refused.value.message


def test_an_embeddings_batch_runs_through_files_and_batches(client):
    texts, expected = reference()
    lines = [json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                         "body": {"model": MINILM_ID, "input": text, "encoding_format": "float"}})
             for i, text in enumerate(texts)]
    f = client.files.create(file=("emb.jsonl", io.BytesIO("\n".join(lines).encode()), "application/jsonl"),
                            purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    deadline = time.time() + 180
    while batch.status not in ("completed", "failed", "expired", "cancelled") and time.time() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    out = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    assert len(out) == len(texts)
    for line in out:
        i = int(line["custom_id"][1:])
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200
        assert cosine(body["data"][0]["embedding"], expected[i]) >= 0.999
