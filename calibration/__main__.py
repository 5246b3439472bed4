"""python -m base_sglang.calibration: the same as base-calibrate (calibrate.py)."""

from base_sglang.calibration.calibrate import main

if __name__ == "__main__":
    raise SystemExit(main())
