// The official OpenAI Node SDK against a running Fallow (FALLOW_BASE_URL, FALLOW_MODEL),
// unmodified: what a Node application developer does first. Run by tests/e2e/test_node_sdk.py.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI, { toFile } from 'openai';

const client = new OpenAI({
  baseURL: `${process.env.FALLOW_BASE_URL}/v1`,
  apiKey: process.env.FALLOW_API_KEY ?? 'unused',
  maxRetries: 0,
  timeout: 120_000,
});
const model = process.env.FALLOW_MODEL;
const ask = (content) => ({
  model,
  messages: [{ role: 'user', content }],
  max_tokens: 12,
  temperature: 0,
});
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test('the served model is listed', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.ok(ids.includes(model), `${model} not in ${ids}`);
});

test('a chat completion answers', async () => {
  const r = await client.chat.completions.create(ask('Say hi.'));
  assert.equal(r.object, 'chat.completion');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(r.usage.completion_tokens > 0);
});

test('a streamed chat completion says what the whole answer says at temperature 0', async () => {
  const whole = await client.chat.completions.create(ask('Name a colour.'));
  const stream = await client.chat.completions.create({
    ...ask('Name a colour.'),
    stream: true,
    stream_options: { include_usage: true },
  });
  let text = '';
  let usage = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    usage = chunk.usage ?? usage;
  }
  assert.equal(text, whole.choices[0].message.content);
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
});

test('an unknown model is a 404 in the SDK error type', async () => {
  await assert.rejects(client.chat.completions.create({ ...ask('hi'), model: 'nope' }), (err) => {
    assert.ok(err instanceof OpenAI.NotFoundError, String(err));
    assert.equal(err.code, 'model_not_found');
    return true;
  });
});

test('a batch file uploaded and run gives one output line per input line', async () => {
  const lines = ['a', 'b', 'c'].map((id, i) =>
    JSON.stringify({
      custom_id: id,
      method: 'POST',
      url: '/v1/chat/completions',
      body: ask(`Count to ${i + 2}.`),
    }),
  );
  const file = await client.files.create({
    file: await toFile(Buffer.from(lines.join('\n') + '\n'), 'batch.jsonl'),
    purpose: 'batch',
  });
  let batch = await client.batches.create({
    input_file_id: file.id,
    endpoint: '/v1/chat/completions',
    completion_window: '24h',
  });
  const deadline = Date.now() + 120_000;
  while (!['completed', 'failed', 'expired', 'cancelled'].includes(batch.status)) {
    assert.ok(Date.now() < deadline, `batch still ${batch.status}`);
    await sleep(300);
    batch = await client.batches.retrieve(batch.id);
  }
  assert.equal(batch.status, 'completed');
  const output = await (await client.files.content(batch.output_file_id)).text();
  const ids = output.trim().split('\n').map((line) => JSON.parse(line).custom_id).sort();
  assert.deepEqual(ids, ['a', 'b', 'c']);
});
