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
const embeddingModel = process.env.FALLOW_EMBEDDING_MODEL;
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

test('embeddings come back as floats, decoded from base64 by default', async () => {
  const floats = await client.embeddings.create({
    model: embeddingModel,
    input: ['The sea is blue.', 'Cats sleep a lot.'],
    encoding_format: 'float',
  });
  assert.equal(floats.data.length, 2);
  assert.equal(floats.data[1].index, 1);
  assert.equal(floats.data[0].embedding.length, 384);
  const decoded = await client.embeddings.create({
    model: embeddingModel,
    input: ['The sea is blue.', 'Cats sleep a lot.'],
  });
  for (const [i, d] of decoded.data.entries()) {
    d.embedding.forEach((v, j) => assert.ok(Math.abs(v - floats.data[i].embedding[j]) < 1e-6));
  }
  assert.ok(floats.usage.prompt_tokens > 0);
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

test('a response is created from a string and its text equals the stream at temperature 0', async () => {
  const params = { model, input: 'Name a fruit.', max_output_tokens: 12, temperature: 0 };
  const whole = await client.responses.create(params);
  assert.equal(whole.object, 'response');
  assert.equal(whole.status === 'completed' || whole.status === 'incomplete', true, whole.status);
  assert.ok(whole.output_text.length > 0);
  const stream = client.responses.stream(params);
  const sequence = [];
  let text = '';
  for await (const event of stream) {
    sequence.push(event.sequence_number);
    if (event.type === 'response.output_text.delta') text += event.delta;
  }
  const final = await stream.finalResponse();
  assert.equal(text, whole.output_text);
  assert.equal(final.output_text, whole.output_text);
  assert.ok(sequence.every((n, i) => i === 0 || n > sequence[i - 1]), `${sequence}`);
});

test('a background response is queued at once and retrieved when done', async () => {
  const queued = await client.responses.create({
    model,
    input: 'Count to three.',
    max_output_tokens: 12,
    temperature: 0,
    background: true,
  });
  assert.ok(['queued', 'in_progress'].includes(queued.status), queued.status);
  let response = queued;
  const deadline = Date.now() + 120_000;
  while (['queued', 'in_progress'].includes(response.status)) {
    assert.ok(Date.now() < deadline, `response still ${response.status}`);
    await sleep(200);
    response = await client.responses.retrieve(queued.id);
  }
  assert.ok(['completed', 'incomplete'].includes(response.status), response.status);
  assert.ok(response.output_text.length > 0);
});
