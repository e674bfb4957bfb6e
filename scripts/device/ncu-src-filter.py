#!/usr/bin/python3
"""An `ncu --page source --csv` export cut to the instructions that have stall samples (and each
kernel's header rows), so a report of many launches fits what a GPU call brings back.
Usage: ncu-src-filter.py SOURCE.csv > FILTERED.csv"""
import csv
import sys

out = csv.writer(sys.stdout)
hdr = None
with open(sys.argv[1], errors="replace") as f:
    for row in csv.reader(f):
        if row and row[0] in ("Address", "Line No", "#"):
            hdr = row
            out.writerow(row)
            continue
        if hdr is None or len(row) != len(hdr) or "Warp Stall Sampling (All Samples)" not in hdr:
            out.writerow(row)
            continue
        if float(row[hdr.index("Warp Stall Sampling (All Samples)")] or 0) > 0:
            out.writerow(row)
