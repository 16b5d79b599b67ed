// Renders the chat templates of the tokenizer_config.json files under
// model/tokenizer/testdata/ (and the random presets' template) with
// @huggingface/jinja, for a set of conversations, into
// model/chat/testdata/golden.json: the reference of glmflash's Go renderer.
//
//   node tools/oracle/templates.js
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require("@huggingface/jinja");

const root = path.join(__dirname, "../..");
const sources = {
  qwen3: path.join(root, "model/tokenizer/testdata/qwen3/tokenizer_config.json"),
  deepseek_v3: path.join(root, "model/tokenizer/testdata/deepseek_v3/tokenizer_config.json"),
  preset: path.join(root, "model/randckpt/tokenizer_config.json"),
};

const tokenString = (t) => (t && typeof t === "object" ? t.content : t ?? "");

const conversations = [
  [{ role: "user", content: "Hello!" }],
  [{ role: "system", content: "You are terse." }, { role: "user", content: "What is 2+2?" }],
  [
    { role: "system", content: "Be kind." },
    { role: "user", content: "Hi" },
    { role: "assistant", content: "Hello, how can I help?" },
    { role: "user", content: "Tell me a joke.\nA short one." },
  ],
  [
    { role: "user", content: "Think first." },
    { role: "assistant", content: "<think>\nhmm\n</think>\n\nDone." },
    { role: "user", content: "Again" },
  ],
  [{ role: "user", content: "Unicode: 你好 😀 e\u0301 <tag> & \"quotes\" {{ not jinja }}" }],
  [{ role: "system", content: "" }, { role: "user", content: "" }],
  [
    { role: "user", content: "a" },
    { role: "assistant", content: "b" },
    { role: "user", content: "c" },
    { role: "assistant", content: "d" },
  ],
  [{ role: "system", content: "one" }, { role: "system", content: "two" }, { role: "user", content: "three" }],
];

// Tool calling and thinking, rendered with the presets' (GLM-4.5) template:
// tools (objects with sorted keys: glmflash's tojson sorts the keys of the
// request's objects), assistant tool_calls with their arguments as objects
// (as vLLM hands them to templates), tool results, reasoning_content and
// chat_template_kwargs.
const weather = {
  function: {
    description: "Weather <forecast> for a city",
    name: "get_weather",
    parameters: { properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"], type: "object" },
  },
  type: "function",
};
const toolCases = [
  { messages: [{ role: "user", content: "Weather in Beijing?" }], tools: [weather] },
  {
    messages: [
      { role: "system", content: "Use tools." },
      { role: "user", content: "Weather in Beijing for 3 days, and Paris?" },
      {
        role: "assistant",
        content: "",
        reasoning_content: "Two calls.",
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "get_weather", arguments: { city: "Beijing", days: 3 } } },
          { id: "call_2", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } },
        ],
      },
      { role: "tool", tool_call_id: "call_1", content: "sunny" },
      { role: "tool", tool_call_id: "call_2", content: "{\"rain\": true}" },
    ],
    tools: [weather],
  },
  {
    messages: [
      { role: "user", content: "Hi" },
      { role: "assistant", content: "<think>greet</think>Hello." },
      { role: "user", content: "Bye" },
    ],
    kwargs: { enable_thinking: false },
  },
  { messages: [{ role: "user", content: "Quick /nothink" }], kwargs: { enable_thinking: false } },
  { messages: [{ role: "user", content: "Deep" }], kwargs: { enable_thinking: true } },
  {
    messages: [
      { role: "user", content: "x" },
      { role: "assistant", content: "y", reasoning_content: "r" },
    ],
  },
];

const golden = [];
for (const [name, file] of Object.entries(sources)) {
  const cfg = JSON.parse(fs.readFileSync(file, "utf8"));
  const tmpl = new Template(cfg.chat_template);
  for (const messages of conversations) {
    for (const add of [true, false]) {
      golden.push({
        template: name,
        messages,
        add_generation_prompt: add,
        rendered: tmpl.render({
          messages,
          add_generation_prompt: add,
          bos_token: tokenString(cfg.bos_token),
          eos_token: tokenString(cfg.eos_token),
        }),
      });
    }
  }
}
{
  const cfg = JSON.parse(fs.readFileSync(sources.preset, "utf8"));
  const tmpl = new Template(cfg.chat_template);
  for (const c of toolCases) {
    for (const add of [true, false]) {
      golden.push({
        template: "preset",
        messages: c.messages,
        tools: c.tools,
        kwargs: c.kwargs,
        add_generation_prompt: add,
        rendered: tmpl.render({
          ...(c.kwargs || {}),
          messages: c.messages,
          tools: c.tools,
          add_generation_prompt: add,
          bos_token: tokenString(cfg.bos_token),
          eos_token: tokenString(cfg.eos_token),
        }),
      });
    }
  }
}
const out = path.join(root, "model/chat/testdata/golden.json");
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify({ note: "written by tools/oracle/templates.js with @huggingface/jinja", cases: golden }, null, 1) + "\n");
console.log(`${golden.length} renders → ${path.relative(process.cwd(), out)}`);
