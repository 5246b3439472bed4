"""Targets of issue 13 with base_plus's rows taken from a new run (e.g. the gated backfill), every other
policy's rows from a committed base-eval JSON of the same windows.

    python benchmarks/results/q11/merge_checks.py NEW.json OLD.json OUT.json

Like `python -m base_sglang.calibration.sweep merge`, but the dense NLL may differ by up to 1e-5 nats
(the committed runs used transformers 5.17.0, these 5.19.0: 1.2e-6 nats apart, far below any SE)."""

import json
import sys

from base_sglang.calibration.sweep import check_targets

new_path, old_path, out_path = sys.argv[1:4]
new, old = json.load(open(new_path)), json.load(open(old_path))
dn, do = ([r for r in f["rows"] if r["policy"] == "dense"][0] for f in (new, old))
assert dn["tokens"] == do["tokens"] and abs(dn["nll"] - do["nll"]) < 1e-5, "other windows"
rows = [r for r in new["rows"] if r["policy"] != "dense"]
rows = [do] + rows + [dict(r, source=old_path) for r in old["rows"]
                      if r["policy"] not in ("dense", "base_plus")]
half_m = old.get("checks", {}).get("half_union_M")
checks = check_targets(rows, half_m, None, top_k=old["meta"]["top_k"])
res = {"meta": dict(new["meta"], merged_from=[new_path, old_path],
                    dense_nll_new_minus_old=dn["nll"] - do["nll"]), "rows": rows, "checks": checks}
json.dump(res, open(out_path, "w"), indent=1)
print(f"{out_path}: dense nll diff {dn['nll'] - do['nll']:.2e}; unbeaten {checks['unbeaten']}")
print("beaten by:", checks["beaten_by"])
print("beaten by > 2 SE:", checks["beaten_significantly_by"])
for e in checks["matched_budget"]:
    print(f"  M={e['M']} exp {e['experts']:.1f} bp {e['dppl_pct']:.3f} oracle {e.get('oracle_dppl_pct', 0):.3f} "
          f"x{e.get('over_oracle', 0):.2f} oracle_plus {e.get('oracle_plus_dppl_pct', 0):.3f} "
          f"x{e.get('over_oracle_plus', 0):.2f}")
for e in checks["matched_interp"]:
    if e["ref_interp_dppl_pct"] is not None and e["experts"] > 0.6 * max(r["experts"] for r in rows):
        print(f"  {e['setting']:28s} {e['experts']:.1f} exp {e['dppl_pct']:.3f} vs {e['ref_interp_dppl_pct']:.3f} "
              f"beats {e['beats_ref']} sig {e['significant']}")
