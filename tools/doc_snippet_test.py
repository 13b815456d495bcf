"""tools/doc_snippet_test.py: runs the numpy snippet of docs/safetensors.md, exactly as written,
on a file saved by `comet run --save`, and checks what it computed (a ctest helper).

    python3 tools/doc_snippet_test.py docs/safetensors.md build/tools/cli_save_test.safetensors

The snippet opens "layer.safetensors" in the current directory, so it runs in a temporary
directory where that name links to the saved file.
"""
import os
import re
import sys
import tempfile

doc, saved = sys.argv[1], os.path.abspath(sys.argv[2])
code = re.search(r"```python\n(.*?)```", open(doc, encoding="utf-8").read(), re.S).group(1)
with tempfile.TemporaryDirectory() as tmp:
    os.symlink(saved, os.path.join(tmp, "layer.safetensors"))
    os.chdir(tmp)
    ns = {}
    exec(compile(code, doc, "exec"), ns)
np = ns["np"]
y, ref, got = ns["y"], ns["ref"], ns["t"][f"rank{ns['r']}.y"]
assert ref.size > 0, "rank 0 of the saved run has no tokens; nothing was checked"
err_oracle = np.linalg.norm(y - ref) / np.linalg.norm(ref)
err_y = np.linalg.norm(y - got) / np.linalg.norm(ref)
# The snippet and the oracle both compute in float64 from the same values: only summation
# order differs. The backend's y carries the storage type's rounding (1e-2 for bf16).
assert err_oracle < 1e-9, f"snippet disagrees with y_oracle: rel_l2 {err_oracle:.3e}"
assert err_y < 1e-2, f"snippet disagrees with the backend's y: rel_l2 {err_y:.3e}"
print("docs/safetensors.md snippet: OK")
