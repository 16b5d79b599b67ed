// glmflash's OpenAI-compatible API through the official `openai` npm
// package: chat, streaming, models, the sampling fields vLLM's clients send,
// tool calls (forced, whole and streamed, and the result sent back) and
// structured output.
// Started by core/openai's TestNodeOpenAIPackage against a server on the
// tiny fixture (GLMFLASH_BASE_URL, GLMFLASH_MODEL); it exits non-zero on the
// first failed check.
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.env.GLMFLASH_BASE_URL;
const model = process.env.GLMFLASH_MODEL;
assert.ok(baseURL && model, "GLMFLASH_BASE_URL and GLMFLASH_MODEL must be set");
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });
let checks = 0;
const check = (what, fn) => { fn(); checks++; console.log(`ok ${checks} ${what}`); };

const messages = [
  { role: "system", content: "Be brief." },
  { role: "user", content: "Hello there" },
];

// Chat, greedy: the whole response.
const res = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
check("chat completion", () => {
  assert.equal(res.object, "chat.completion");
  assert.match(res.id, /^chatcmpl-/);
  assert.ok(res.created > 0, "created is set");
  assert.equal(res.choices.length, 1);
  assert.equal(res.choices[0].message.role, "assistant");
  assert.equal(res.choices[0].finish_reason, "length");
  assert.ok(res.choices[0].message.content.length > 0);
  assert.equal(res.usage.completion_tokens, 16);
});

// The same request streamed gives the same text, and the usage at the end.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "", reason = null, usage = null, chunks = 0;
for await (const c of stream) {
  chunks++;
  if (c.choices.length > 0) {
    text += c.choices[0].delta.content ?? "";
    reason = c.choices[0].finish_reason ?? reason;
  }
  if (c.usage) usage = c.usage;
}
check("streamed chat = whole chat", () => {
  assert.ok(chunks > 3, `streamed in pieces (${chunks} chunks)`);
  assert.equal(text, res.choices[0].message.content);
  assert.equal(reason, "length");
  assert.equal(usage.completion_tokens, 16);
});

// A sampling field of vLLM's that the SDK passes through: top_k 1 samples
// (temperature 1) only the most likely token, so it is the greedy output.
const topk = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 1, seed: 7, top_k: 1 });
check("top_k 1 = greedy", () => assert.equal(topk.choices[0].message.content, res.choices[0].message.content));

// OpenAI's logit_bias: +100 on id 65 ("A" in the fixture's bytes-only
// vocabulary) forces it at every step.
const biased = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, logit_bias: { "65": 100 } });
check("logit_bias +100 forces the token", () => assert.equal(biased.choices[0].message.content, "AAAAAAAA"));

// A bad sampling value is a 400 naming it.
await assert.rejects(
  client.chat.completions.create({ model, messages, max_tokens: 4, min_p: 1.5 }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "min_p",
);
checks++; console.log(`ok ${checks} min_p out of range → 400 param min_p`);

// Fields that change nothing here are accepted (vLLM's behaviour).
const ignored = await client.chat.completions.create({
  model, messages, max_tokens: 2, temperature: 0, store: false, metadata: { app: "node-test" }, user: "u-1", service_tier: "auto",
});
check("store, metadata, user, service_tier accepted", () => assert.equal(ignored.usage.completion_tokens, 2));

// Models: the list, one by id, another id a 404.
const list = await client.models.list();
check("models.list", () => {
  assert.equal(list.data.length, 1);
  assert.equal(list.data[0].id, model);
  assert.ok(list.data[0].created > 0);
});
const one = await client.models.retrieve(model);
check("models.retrieve", () => assert.equal(one.id, model));
await assert.rejects(client.models.retrieve("gpt-4"), (e) => e instanceof OpenAI.NotFoundError && e.code === "model_not_found");
checks++; console.log(`ok ${checks} models.retrieve of another id → 404 model_not_found`);

// The client's X-Request-Id is the request's id, echoed.
const { data, response } = await client.chat.completions
  .create({ model, messages, max_tokens: 2, temperature: 0 }, { headers: { "X-Request-Id": "node-req-1" } })
  .withResponse();
check("X-Request-Id honoured and echoed", () => {
  assert.equal(response.headers.get("x-request-id"), "node-req-1");
  assert.equal(data.id, "chatcmpl-node-req-1");
});

// Tool calling, as an agent does it: the call forced (tool_choice required:
// random weights would not call otherwise), parsed into tool_calls whole
// and streamed, then the tool's result sent back and answered.
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    parameters: {
      type: "object", additionalProperties: false, required: ["city", "days"],
      properties: { city: { type: "string", maxLength: 10 }, days: { type: "integer" } },
    },
  },
}];
const ask = [{ role: "user", content: "Weather in Beijing for 3 days?" }];
const noThink = { chat_template_kwargs: { enable_thinking: false } };
const called = await client.chat.completions.create({
  model, messages: ask, tools, tool_choice: "required", max_tokens: 300, temperature: 1, seed: 3, ...noThink,
});
const call = called.choices[0].message.tool_calls?.[0];
check("tool_choice required → tool_calls", () => {
  assert.equal(called.choices[0].finish_reason, "tool_calls");
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.match(call.id, /^call_/);
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args.city, "string");
  assert.ok(Number.isInteger(args.days));
});
const callStream = await client.chat.completions.create({
  model, messages: ask, tools, tool_choice: "required", max_tokens: 300, temperature: 1, seed: 3, stream: true, ...noThink,
});
let streamedName = "", streamedArgs = "", streamedFinish = null;
for await (const c of callStream) {
  for (const tc of c.choices[0]?.delta?.tool_calls ?? []) {
    streamedName += tc.function?.name ?? "";
    streamedArgs += tc.function?.arguments ?? "";
  }
  streamedFinish = c.choices[0]?.finish_reason ?? streamedFinish;
}
check("streamed delta.tool_calls = the whole call", () => {
  assert.equal(streamedFinish, "tool_calls");
  assert.equal(streamedName, call.function.name);
  assert.deepEqual(JSON.parse(streamedArgs), JSON.parse(call.function.arguments));
});
const answered = await client.chat.completions.create({
  model, tools, tool_choice: "none", max_tokens: 8, temperature: 0, ...noThink,
  messages: [...ask, called.choices[0].message, { role: "tool", tool_call_id: call.id, content: '{"forecast":["sun","rain","sun"]}' }],
});
check("tool result → an answer in text", () => {
  assert.ok(answered.choices[0].message.content.length > 0);
  assert.ok(!answered.choices[0].message.tool_calls?.length);
  assert.ok(answered.usage.prompt_tokens > called.usage.prompt_tokens);
});

// Structured output: json_schema's output parses and has its fields.
const person = await client.chat.completions.create({
  model, messages, max_tokens: 120, temperature: 1, seed: 5,
  response_format: {
    type: "json_schema",
    json_schema: {
      name: "person", strict: true, schema: {
        type: "object", additionalProperties: false, required: ["name", "age"],
        properties: { name: { type: "string", maxLength: 12 }, age: { type: "integer" } },
      },
    },
  },
});
check("response_format json_schema → valid JSON", () => {
  assert.equal(person.choices[0].finish_reason, "stop");
  const v = JSON.parse(person.choices[0].message.content);
  assert.deepEqual(Object.keys(v).sort(), ["age", "name"]);
  assert.equal(typeof v.name, "string");
  assert.ok(Number.isInteger(v.age));
});

console.log(`all ${checks} checks passed`);
