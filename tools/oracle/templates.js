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
const out = path.join(root, "model/chat/testdata/golden.json");
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, JSON.stringify({ note: "written by tools/oracle/templates.js with @huggingface/jinja", cases: golden }, null, 1) + "\n");
console.log(`${golden.length} renders → ${path.relative(process.cwd(), out)}`);
