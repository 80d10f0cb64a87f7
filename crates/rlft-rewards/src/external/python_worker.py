"""rlft's worker for `type = "python"` rewards (embedded in rlft; run as `python -u -c`).

Usage: python -u -c <this file> PATH FUNCTION

Imports FUNCTION from the file PATH once, then answers one JSON line per batch on stdin:

    {"trainer_state": {"global_step": 2, "max_steps": 10, "epoch": 0.5},
     "samples": [{"prompt": "...", "completion": "...", "completion_ids": [1, 2], "row": {...}}]}

by calling FUNCTION with TRL's keyword arguments (`prompts`, `completions`, `completion_ids`,
`trainer_state`, and every other dataset column as a list) and printing one line:

    {"scores": [1.0, null, ...]}                       one float or null per sample, or
    {"error": {"kind": ..., "message": ..., "traceback": ...}}

Kinds: "missing" (no such file or function: a config mistake), "import" (the file raised while
importing), "exception" (the function raised), "output" (it returned something unusable).
Only the standard library is used, so any interpreter with the user's packages can run it.
"""

import dataclasses
import importlib.util
import json
import math
import numbers
import os
import sys
import traceback
import types

# Keys the call sets itself; a dataset column of the same name is not passed (TRL would fail
# with "got multiple values for keyword argument").
RESERVED = ("prompt", "completion", "completion_ids", "prompts", "completions", "trainer_state")
# Longest traceback sent back, in lines (the innermost frames are kept: they say what failed).
TRACEBACK_LINES = 40


@dataclasses.dataclass
class TrainerState:
    """The fields of transformers' TrainerState that rlft knows (reward functions read them as
    attributes, e.g. `trainer_state.global_step`)."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True


def error(kind, message, trace=None):
    return {"error": {"kind": kind, "message": message, "traceback": trace}}


def format_traceback(exc, skip_own_frame):
    tb = exc.__traceback__
    if skip_own_frame and tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the first frame is this worker's call of the function
    lines = "".join(traceback.format_exception(type(exc), exc, tb)).rstrip().splitlines()
    if len(lines) > TRACEBACK_LINES:
        cut = len(lines) - (TRACEBACK_LINES - 1)
        lines = lines[:1] + ["  ... (%d lines left out)" % cut] + lines[-(TRACEBACK_LINES - 2) :]
    return "\n".join(lines)


def load(path, name):
    """The function, or an error answer."""
    if not os.path.isfile(path):
        return None, error(
            "missing",
            "%s is not a file (working directory %s); give `path` relative to it, or absolute"
            % (path, os.getcwd()),
        )
    path = os.path.abspath(path)
    # Helpers next to the file import as they would when running it from its folder.
    sys.path.insert(0, os.path.dirname(path))
    stem = os.path.splitext(os.path.basename(path))[0]
    # The file's own name, unless that would shadow a module already loaded (`random.py`).
    module_name = stem if stem not in sys.modules else "rlft_reward_" + stem
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        return None, error("missing", "%s cannot be imported as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickle look modules up by name
    try:
        spec.loader.exec_module(module)
    except BaseException as e:  # SystemExit at import is the user's error too
        return None, error("import", "importing %s raised %s" % (path, type(e).__name__),
                           format_traceback(e, False))
    function = getattr(module, name, None)
    if function is None or not callable(function):
        own = [k for k, v in vars(module).items()
               if callable(v) and not k.startswith("_")
               and getattr(v, "__module__", None) == module_name]
        others = [k for k, v in vars(module).items()
                  if callable(v) and not k.startswith("_") and k not in own]
        listed = own or others
        what = "has no function `%s`" % name if function is None else "`%s` is not callable" % name
        return None, error(
            "missing",
            "%s %s; its functions: %s; set `function` to one of them"
            % (path, what, ", ".join(sorted(listed)) or "(none)"),
        )
    return function, None


def is_conversational(prompt):
    """TRL's test: the prompt is a list of {role, content} messages."""
    return (isinstance(prompt, list) and len(prompt) > 0
            and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt))


def arguments(request):
    """The keyword arguments TRL's GRPOTrainer passes a reward function."""
    samples = request["samples"]
    rows = [s["row"] if isinstance(s["row"], dict) else {} for s in samples]
    # TRL's `prompts` is the dataset's `prompt` column as is; without one, the rendered prompt.
    prompts = [row["prompt"] if "prompt" in row else s["prompt"] for row, s in zip(rows, samples)]
    if prompts and is_conversational(prompts[0]):
        completions = [[{"role": "assistant", "content": s["completion"]}] for s in samples]
    else:
        completions = [s["completion"] for s in samples]
    columns = []
    for row in rows:
        columns.extend(k for k in row if k not in RESERVED and k not in columns)
    kwargs = {k: [row.get(k) for row in rows] for k in columns}
    kwargs["prompts"] = prompts
    kwargs["completions"] = completions
    kwargs["completion_ids"] = [s["completion_ids"] for s in samples]
    kwargs["trainer_state"] = TrainerState(**request.get("trainer_state", {}))
    return kwargs


def short(value):
    text = repr(value)
    return text if len(text) <= 120 else text[:120] + "..."


def scores_of(result, n):
    """The answer for what the function returned: {"scores": [...]} or an "output" error."""
    expected = "a reward function returns a list with one float (or None) per completion"
    if not isinstance(result, (list, tuple)) and hasattr(result, "tolist"):
        result = result.tolist()  # a numpy array or a torch tensor
    if not isinstance(result, (list, tuple)):
        return error("output", "returned %s %s; %s" % (type(result).__name__, short(result), expected))
    if len(result) != n:
        return error("output", "returned %d value%s for %d completions; %s, in order"
                     % (len(result), "" if len(result) == 1 else "s", n, expected))
    scores = []
    for i, x in enumerate(result):
        if x is None:
            scores.append(None)
            continue
        if isinstance(x, numbers.Real):
            value = float(x)
        elif hasattr(x, "item") and isinstance(getattr(x, "item")(), numbers.Real):
            value = float(x.item())  # a numpy or torch scalar
        else:
            return error("output", "value %d is %s %s; %s" % (i, type(x).__name__, short(x), expected))
        if math.isinf(value):
            return error("output", "value %d is %s; return a finite float, or None where the "
                         "reward does not apply" % (i, value))
        # TRL turns None into NaN: a NaN is "not applicable" too.
        scores.append(None if math.isnan(value) else value)
    return {"scores": scores}


def main():
    path, name = sys.argv[1], sys.argv[2]
    # The answers own the real stdout; whatever the user's code prints goes to stderr, which rlft
    # keeps the last lines of for error messages, so a stray print() cannot corrupt an answer.
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.stdin.reconfigure(encoding="utf-8")
    function, failed = load(path, name)
    for line in sys.stdin:
        if not line.strip():
            continue
        if failed is not None:
            answer = failed
        else:
            request = json.loads(line)
            kwargs = arguments(request)
            try:
                result = function(**kwargs)
                if isinstance(result, types.GeneratorType):
                    result = list(result)  # TRL iterates whatever comes back
            except BaseException as e:  # the user's sys.exit() is reported too
                answer = error("exception", "raised %s" % type(e).__name__, format_traceback(e, True))
            else:
                answer = scores_of(result, len(request["samples"]))
        answers.write(json.dumps(answer, allow_nan=False) + "\n")
        answers.flush()


main()
