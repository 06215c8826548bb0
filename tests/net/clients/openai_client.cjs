// The official OpenAI client (npm package `openai`, installed by scripts/setup) against a
// running `computron serve`. Usage: OPENAI_MODULE=<path> node openai_client.cjs URL MODEL
// Prints one JSON object with what it saw; the C++ test (llm_api_e2e_test.cpp) judges it.
const OpenAI = require(process.env.OPENAI_MODULE);

const [url, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60000 });

async function streamed(params) {
  const stream = await client.completions.create({ ...params, stream: true });
  let text = '';
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks += 1;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  return { text, chunks, finish };
}

async function failure(params) {
  try {
    await client.completions.create(params);
    return { status: 200 };
  } catch (e) {
    return { status: e.status, code: e.code, type: e.type, param: e.param, message: e.message };
  }
}

(async () => {
  const out = {};
  out.models = (await client.models.list()).data.map((m) => m.id);
  const base = { model, prompt: 'a b c', max_tokens: 12, temperature: 0.8, seed: 5 };
  const c = await client.completions.create(base);
  out.text = c.choices[0].text;
  out.finish = c.choices[0].finish_reason;
  out.usage = c.usage;
  out.stream = await streamed(base);
  // A stop string from the middle of the text: the text ends right before it.
  const stop = out.text.slice(3, 6);
  out.stop = stop;
  out.stop_expected = out.text.slice(0, out.text.indexOf(stop));
  const s = await client.completions.create({ ...base, stop: [stop] });
  out.stopped = { text: s.choices[0].text, finish: s.choices[0].finish_reason, usage: s.usage };
  out.stopped_stream = await streamed({ ...base, stop: stop });
  const short = await client.completions.create({ ...base, max_tokens: 3 });
  out.short = { finish: short.choices[0].finish_reason, usage: short.usage };
  out.unknown_model = await failure({ ...base, model: 'no-such-model' });
  out.bad_parameter = await failure({ ...base, tempreature: 0.5 });
  out.bad_range = await failure({ ...base, max_tokens: 0 });
  console.log(JSON.stringify(out));
})().catch((e) => {
  console.log(JSON.stringify({ fatal: String(e && e.stack ? e.stack : e) }));
});
