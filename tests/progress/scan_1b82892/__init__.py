"""The log scanner as it was at commit 1b82892, the reference test_scan_reference.py holds today's to.

Verbatim copies of collector/progress/{scan,trainers,hangs,streams}.py at 1b82892, their imports
of each other pointed here; what did not change since (model, numbers, timestamps, xid) is today's.
Regenerate: git show 1b82892:collector/progress/scan.py > tests/progress/scan_1b82892/scan.py (each
module), then the `from collector.progress...` imports of those four modules →
`tests.progress.scan_1b82892`.
"""
