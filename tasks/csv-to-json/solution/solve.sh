#!/bin/bash
python3 - <<'PY'
import csv, json

casts = {"id": int, "age": int, "salary": float, "remote": lambda v: v == "true"}
with open("/data/employees.csv", newline="") as f:
    rows = [{k: (casts.get(k, str)(v) if v != "" else None) for k, v in row.items()} for row in csv.DictReader(f)]
with open("/app/employees.json", "w") as f:
    json.dump(rows, f, indent=2)
PY
