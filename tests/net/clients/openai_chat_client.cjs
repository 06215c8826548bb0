// The official OpenAI client (npm `openai`) chatting with a running `computron serve`, with
// Hugging Face's own Jinja and tokenizer in JavaScript (@huggingface/jinja,
// @huggingface/tokenizers) as the oracle for the rendered prompt and its token count.
// Usage: OPENAI_MODULE=<path> NPM_MODULES=<node_modules> node openai_chat_client.cjs URL MODEL TOKDIR
// Prints one JSON object with what it saw; the C++ test (chat_e2e_test.cpp) judges it.
const fs = require('node:fs');
const path = require('node:path');
const { pathToFileURL } = require('node:url');
const OpenAI = require(process.env.OPENAI_MODULE);

const [url, model, tokdir] = process.argv.slice(2);
const modules = process.env.NPM_MODULES;
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 120000 });

async function failure(params) {
  try {
    await client.chat.completions.create(params);
    return { status: 200 };
  } catch (e) {
    return { status: e.status, code: e.code, type: e.type, param: e.param, message: e.message };
  }
}

(async () => {
  const { Template } = await import(pathToFileURL(path.join(modules, '@huggingface/jinja/dist/index.js')).href);
  const { Tokenizer } = await import(
    pathToFileURL(path.join(modules, '@huggingface/tokenizers/dist/tokenizers.mjs')).href);
  const read = (f) => JSON.parse(fs.readFileSync(path.join(tokdir, f), 'utf8'));
  const config = read('tokenizer_config.json');
  const tok = new Tokenizer(read('tokenizer.json'), config);
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Name a colour.' },
    { role: 'assistant', content: 'Blue.' },
    { role: 'user', content: [{ type: 'text', text: 'Another' }, { type: 'text', text: 'one?' }] },
  ];
  // The oracle renders what the server must render: list content joined with newlines.
  const flat = messages.map((m) => ({
    role: m.role,
    content: Array.isArray(m.content) ? m.content.map((p) => p.text).join('\n') : m.content,
  }));
  const out = {};
  out.rendered = new Template(config.chat_template).render({
    messages: flat, add_generation_prompt: true, bos_token: config.bos_token, eos_token: config.eos_token,
  });
  out.oracle_ids = tok.encode(out.rendered, { add_special_tokens: false }).ids;
  const base = { model, messages, max_tokens: 8, temperature: 0 };
  const c = await client.chat.completions.create(base);
  out.chat = { id: c.id, object: c.object, message: c.choices[0].message,
               finish: c.choices[0].finish_reason, usage: c.usage };
  const stream = await client.chat.completions.create({
    ...base, stream: true, stream_options: { include_usage: true } });
  out.stream = { text: '', chunks: 0, first_role: null, finish: null, usage: null, objects: [] };
  for await (const chunk of stream) {
    out.stream.chunks += 1;
    if (!out.stream.objects.includes(chunk.object)) out.stream.objects.push(chunk.object);
    if (chunk.usage) out.stream.usage = chunk.usage;
    for (const ch of chunk.choices) {
      if (out.stream.chunks === 1) out.stream.first_role = ch.delta.role || null;
      out.stream.text += ch.delta.content || '';
      if (ch.finish_reason) out.stream.finish = ch.finish_reason;
    }
  }
  // The same prompt through /v1/completions, as the oracle's ids.
  const p = await client.completions.create({ model, prompt: out.oracle_ids, max_tokens: 8, temperature: 0 });
  out.completion = { text: p.choices[0].text, usage: p.usage };
  // <|eot_id|> is one of Llama 3's EOS ids (generation_config.json): forced, it ends the row.
  const eot = tok.encode('<|eot_id|>', { add_special_tokens: false }).ids[0];
  out.eot = eot;
  const forced = await client.chat.completions.create({ ...base, logit_bias: { [eot]: 100 } });
  out.forced = { content: forced.choices[0].message.content, finish: forced.choices[0].finish_reason,
                 usage: forced.usage };
  const ignored = await client.chat.completions.create({
    ...base, max_tokens: 3, logit_bias: { [eot]: 100 }, ignore_eos: true, skip_special_tokens: false });
  out.ignored = { content: ignored.choices[0].message.content, finish: ignored.choices[0].finish_reason,
                  usage: ignored.usage };
  const lp = await client.chat.completions.create({ ...base, max_tokens: 3, logprobs: true, top_logprobs: 2 });
  out.logprobs = lp.choices[0].logprobs;
  out.logprobs_text = lp.choices[0].message.content;
  const two = await client.chat.completions.create({ ...base, n: 2, temperature: 1, seed: 7 });
  out.n = two.choices.map((x) => ({ index: x.index, content: x.message.content }));
  // Without a seed, generation_config.json's temperature applies and each request samples anew.
  const draws = [];
  for (let i = 0; i < 2; i += 1) {
    const d = await client.chat.completions.create({ model, messages, max_tokens: 8 });
    draws.push(d.choices[0].message.content);
  }
  out.unseeded = draws;
  // Fields OpenAI and vLLM define that change nothing here are accepted; request_id names it.
  const extras = await client.chat.completions.create({
    ...base, store: false, metadata: { team: 'a' }, service_tier: 'auto', reasoning_effort: 'low',
    modalities: ['text'], prompt_cache_key: 'k', priority: 1, request_id: 'req-42' });
  out.extras = { id: extras.id, content: extras.choices[0].message.content };
  out.beam = await failure({ ...base, use_beam_search: true });
  out.tools = await failure({ ...base, tools: [{ type: 'function', function: { name: 'f' } }] });
  out.unknown_model = await failure({ ...base, model: 'no-such-model' });
  out.bad_role = await failure({ ...base, messages: [{ role: 'wizard', content: 'x' }] });
  console.log(JSON.stringify(out));
})().catch((e) => {
  console.log(JSON.stringify({ fatal: String(e && e.stack ? e.stack : e) }));
});
