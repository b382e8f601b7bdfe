"""The official OpenAI Node SDK (npm `openai` 7.x) against the stack: `node --test` runs
tests/e2e/node/sdk.test.mjs, whose tests say what they check. infra/test.sh installs Node and
the SDK; without them this skips (and fails under CI=true)."""

import os
import shutil
import subprocess

from conftest import MINILM_ID, MODEL_ID, ROOT, skip_for_want_of

NODE_DIR = ROOT / "tests" / "e2e" / "node"


def test_the_node_sdk_works_unmodified(embedding_stack):
    stack = embedding_stack
    node = shutil.which("node")
    if not node:
        skip_for_want_of("Node.js")
    if not (NODE_DIR / "node_modules" / "openai").is_dir():
        skip_for_want_of("the openai npm package (npm install in tests/e2e/node)")
    env = dict(os.environ, FALLOW_BASE_URL=stack.base_url, FALLOW_MODEL=MODEL_ID,
               FALLOW_EMBEDDING_MODEL=MINILM_ID)
    run = subprocess.run([node, "--test", "--test-reporter=spec", "sdk.test.mjs"], cwd=NODE_DIR,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
