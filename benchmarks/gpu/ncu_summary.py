"""Summarise Nsight Compute's per-instruction source page (issue 12) into a small JSON.

    python benchmarks/gpu/ncu_summary.py NCU_SOURCE_SASS.csv NCU_DETAILS.txt OUT.json
The source page (`ncu --import R --page source --csv --print-source sass`) lists every SASS
instruction of each profiled kernel with its executed count; the details page has each kernel's
duration, registers and warp cycles per issued instruction. Per kernel, in profiling order: static
instructions, warp-instructions executed, the opcodes executed most, and the code split at barriers
and branches into runs of more than 100 instructions (where the straight-line work is). A kernel
that runs one program of a few warps is a dependent chain: its time is about its instructions per
warp times the cycles per issued instruction.
"""

from __future__ import annotations

import collections
import csv
import json
import re
import sys


def kernels_of(source_csv: str) -> list[dict]:
    out, cur = [], None
    for r in csv.reader(open(source_csv)):
        if r and r[0] == "Kernel Name":
            cur = dict(name=r[1], hdr=None, ins=[])
            out.append(cur)
        elif r and r[0] == "Address" and cur is not None:
            cur["hdr"] = r
        elif cur is not None and cur["hdr"] and len(r) > 5:
            cur["ins"].append(dict(zip(cur["hdr"], r)))
    return out


def details_of(details_txt: str) -> list[dict]:
    """Per profiled kernel, in order: launch shape, duration us, registers, cycles per issue."""
    out, cur = [], None
    for line in open(details_txt):
        m = re.match(r"\s+(\S+) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)", line)
        if m:
            cur = dict(grid=int(m.group(2)) * int(m.group(3)) * int(m.group(4)),
                       threads=int(m.group(5)) * int(m.group(6)) * int(m.group(7)))
            out.append(cur)
            continue
        for key, pat in (("duration_us", r"\s+Duration\s+(\S+)\s+([\d.,]+)"),
                         ("registers", r"\s+Registers Per Thread\s+\S+\s+([\d.,]+)"),
                         ("cycles_per_issue", r"\s+Warp Cycles Per Issued Instruction\s+\S+\s+([\d.,]+)")):
            m = re.match(pat, line)
            if m and cur is not None and key not in cur:
                val = float(m.groups()[-1].replace(",", ""))
                if key == "duration_us" and m.group(1) in ("ms", "msecond"):
                    val *= 1e3
                if key == "duration_us" and m.group(1) in ("ns", "nsecond"):
                    val /= 1e3
                cur[key] = val
    return out


def opcode(sass: str) -> str:
    parts = sass.split()
    return (parts[1] if parts[0].startswith("@") else parts[0]).split(".")[0]


def summary(k: dict) -> dict:
    ins = k["ins"]
    executed = collections.Counter()
    runs, start = [], 0
    for i, x in enumerate(ins):
        op = opcode(x["Source"])
        executed[op] += int(x["Instructions Executed"] or 0)
        if op in ("BAR", "BRA", "EXIT"):
            if i + 1 - start > 100:
                runs.append([start, i + 1])
            start = i + 1
    return dict(kernel=k["name"], instructions=len(ins),
                warp_instructions_executed=sum(executed.values()),
                top_opcodes_executed=executed.most_common(8), runs_over_100=runs)


def main() -> int:
    source_csv, details_txt, out = sys.argv[1:4]
    rows = [summary(k) for k in kernels_of(source_csv)]
    for row, det in zip(rows, details_of(details_txt)):
        row.update(det)
        if det.get("threads"):
            row["instructions_per_warp"] = round(row["warp_instructions_executed"]
                                                 / (det["grid"] * det["threads"] / 32))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        print(f"{r['kernel']:22} grid {r.get('grid')} x {r.get('threads')}  {r.get('duration_us')} us  "
              f"{r['instructions']} SASS, {r.get('instructions_per_warp')} per warp, "
              f"{r.get('cycles_per_issue')} cycles/issue, {r.get('registers')} regs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
