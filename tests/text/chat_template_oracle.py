# The oracle for text/chat_template as transformers renders chat templates: Python's
# Jinja2 in the environment transformers builds (transformers/utils/chat_template_utils.py,
# _cached_compile_jinja_template, as of transformers 5.17): an ImmutableSandboxedEnvironment
# with trim_blocks and lstrip_blocks, the loopcontrols extension and the {% generation %}
# tag, a raise_exception global that raises, strftime_now, and tojson as json.dumps with
# ensure_ascii=False. Where it and chat_template_oracle.mjs (@huggingface/jinja) disagree,
# this one is the reference: it is what a model's template was written and tested against.
# The venv scripts/setup makes ($COMPUTRON_VENV, default ~/.cache/computron/venv) has it.
#
#   python3 chat_template_oracle.py render IN OUT   renders IN's cases ([{template, context}],
#                                                   template being the source) into OUT
#                                                   ([{output} or {error}]), then prints
#                                                   "done" (the contract of the .mjs render;
#                                                   its "generate" stays with the .mjs)
#
# Only jinja2 is imported, not transformers (seconds of start-up, and torch): the setup below
# is transformers' own, line for line where it matters.
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.exceptions
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The file contract every oracle here keeps, beside this file whatever the working directory;
# no __pycache__ left in the source tree by the tests.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_io import answer_files  # noqa: E402


class generation_tag(jinja2.ext.Extension):
    """transformers' AssistantTracker without the tracking: {% generation %}...
    {% endgeneration %} parses and renders its body (the tracker is only active when
    apply_chat_template is asked for an assistant mask)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(
            self.call_method("_generation_support"), [], [], body
        ).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja's own tojson, which escapes HTML characters.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def strftime_now(format):
    return datetime.now().strftime(format)


def environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[generation_tag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, compiled, source, context):
    try:
        if source not in compiled:
            compiled[source] = env.from_string(source)
        # transformers' render_jinja_template always passes tools and documents, None when
        # the request has none: `tools is defined` holds in every real rendering.
        context = dict(context)
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        return {"output": compiled[source].render(**context)}
    except Exception as e:  # noqa: BLE001 - any failure is the case's answer, not ours
        return {"error": str(e)}


def render_all(cases):
    env, compiled = environment(), {}
    return [render(env, compiled, c["template"], c["context"]) for c in cases]


def main(argv):
    return answer_files(argv, "render", "chat_template_oracle.py render IN OUT", render_all)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
