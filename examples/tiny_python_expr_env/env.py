"""A second-chance arithmetic environment for rlft's [environment] (docs/tools.md).

rlft starts it once (`command = ["python3", "env.py"]`) and writes one JSON request per line
to its stdin; it answers each with one JSON line on stdout.

- reset: remembers the row's ground truth. No observation: the row's prompt is the task.
- step: reads the last \\boxed{...} of the model's turn. Right: reward 1.0 on the first try,
  0.5 on the second, done. Wrong (or no box) on the first try: reward 0 and a request to work
  it out again; on the second: reward 0, done.
- close: forgets the episodes.

Nothing the model writes is run: the answer is read as a number.
"""

import json
import re
import sys

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
RETRY = (
    "That is not right. Work the expression out again, one operation per line, "
    "and give the final result as \\boxed{answer}."
)


def number(text):
    try:
        return float(text.strip().strip("$").replace(",", ""))
    except ValueError:
        return None


def right(action, truth):
    boxes = BOX.findall(action)
    if not boxes:
        return False
    got, want = number(boxes[-1]), number(str(truth))
    return got is not None and want is not None and abs(got - want) <= 1e-6 * max(1.0, abs(want))


def main():
    episodes = {}
    for line in sys.stdin:
        req = json.loads(line)
        method = req["method"]
        if method == "reset":
            truth = req["row"]["reward_model"]["ground_truth"]
            episodes[req["episode"]] = {"truth": truth, "tries": 0}
            answer = {"observation": None}
        elif method == "step":
            ep = episodes[req["episode"]]
            ep["tries"] += 1
            if right(req["action"], ep["truth"]):
                reward = 1.0 if ep["tries"] == 1 else 0.5
                answer = {"observation": None, "reward": reward, "done": True}
            elif ep["tries"] >= 2:
                answer = {"observation": None, "reward": 0.0, "done": True}
            else:
                answer = {"observation": RETRY, "reward": 0.0, "done": False}
        elif method == "close":
            for e in req["episodes"]:
                episodes.pop(e, None)
            answer = {}
        else:
            answer = {"error": "unknown method %r" % method}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
