#!/usr/bin/env python3
"""Helpers for run.sh around the MCP conformance suite and its baseline file.

  conformance_eval.py skip BASELINE SCENARIO
      exit 0 if the whole scenario is in the baseline (do not run it), 1 otherwise.
  conformance_eval.py names BASELINE
      print every scenario name the baseline mentions, one a line.
  conformance_eval.py judge BASELINE SCENARIO OUTPUT_DIR
      read OUTPUT_DIR/**/checks.json written by `conformance server -o OUTPUT_DIR`, print one
      line per FAILURE or WARNING check, note baselined checks that now pass, and exit 1 if a
      check failed that the baseline does not name (or no results were written).

Baseline lines: `scenario # reason` or `scenario:check-id # reason`; `#` starts a comment.
Only stdlib is used.
"""

from __future__ import annotations

import json
import pathlib
import sys


def read_baseline(path: str) -> tuple[set[str], dict[str, set[str]]]:
    whole: set[str] = set()
    checks: dict[str, set[str]] = {}
    for number, raw in enumerate(pathlib.Path(path).read_text().splitlines(), 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        if " " in entry:
            sys.exit(f"{path}:{number}: malformed entry {raw!r} (expected `scenario[:check-id] # reason`)")
        if ":" in entry:
            scenario, check_id = entry.split(":", 1)
            checks.setdefault(scenario, set()).add(check_id)
        else:
            whole.add(entry)
    return whole, checks


def judge(baseline: str, scenario: str, output_dir: str) -> int:
    _, allowed = read_baseline(baseline)
    allowed_here = allowed.get(scenario, set())
    files = sorted(pathlib.Path(output_dir).glob("**/checks.json"))
    if not files:
        print(f"    no results written for {scenario}")
        return 1
    results = []
    for file in files:
        results.extend(json.loads(file.read_text()))

    unexpected = 0
    seen_status: dict[str, set[str]] = {}
    for check in results:
        check_id = check.get("id", "?")
        status = check.get("status", "?")
        seen_status.setdefault(check_id, set()).add(status)
        details = check.get("details")
        message = check.get("errorMessage") or (details.get("message") if isinstance(details, dict) else None)
        message = (message or check.get("description") or "").replace("\n", " ")
        if status == "FAILURE":
            if check_id in allowed_here:
                print(f"    baselined failure {scenario}:{check_id}: {message}")
            else:
                unexpected += 1
                print(f"    FAILURE {scenario}:{check_id}: {message}")
                if details is not None:
                    print(f"      details: {json.dumps(details)[:2000]}")
        elif status == "WARNING":
            print(f"    warning {scenario}:{check_id}: {message}")
    for check_id in sorted(allowed_here):
        statuses = seen_status.get(check_id)
        if statuses and statuses <= {"SUCCESS"}:
            print(f"    note: baseline entry {scenario}:{check_id} now passes; consider removing it")
    return 1 if unexpected else 0


def main() -> int:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    command, baseline = sys.argv[1], sys.argv[2]
    if command == "skip" and len(sys.argv) == 4:
        whole, _ = read_baseline(baseline)
        return 0 if sys.argv[3] in whole else 1
    if command == "names" and len(sys.argv) == 3:
        whole, checks = read_baseline(baseline)
        for name in sorted(whole | set(checks)):
            print(name)
        return 0
    if command == "judge" and len(sys.argv) == 5:
        return judge(baseline, sys.argv[3], sys.argv[4])
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main())
