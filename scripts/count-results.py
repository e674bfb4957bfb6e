#!/usr/bin/python3
"""Prints the closing 'N passed, N failed, N skipped' line from the real results of the test run:
meson's testlog.json of each build dir given, plus any JUnit XML (pytest) and node TAP summaries
the run left in those dirs (junit-*.xml, node-*.tap)."""
import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for d in sys.argv[1:]:
    log = os.path.join(d, "meson-logs", "testlog.json")
    if os.path.exists(log):
        with open(log) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line).get("result")
                if r in ("OK", "EXPECTEDFAIL"):
                    passed += 1
                elif r == "SKIP":
                    skipped += 1
                else:
                    failed += 1
    for x in glob.glob(os.path.join(d, "junit-*.xml")):
        root = ET.parse(x).getroot()
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        for s in suites:
            n = int(s.get("tests", 0))
            f_ = int(s.get("failures", 0)) + int(s.get("errors", 0))
            sk = int(s.get("skipped", 0))
            passed += n - f_ - sk
            failed += f_
            skipped += sk
    for t in glob.glob(os.path.join(d, "node-*.tap")):
        text = open(t).read()
        def count(k):
            m = re.search(r"^# %s (\d+)$" % k, text, re.M)
            return int(m.group(1)) if m else 0
        passed += count("pass")
        failed += count("fail") + count("cancelled")
        skipped += count("skipped") + count("todo")

print(f"{passed} passed, {failed} failed, {skipped} skipped")
