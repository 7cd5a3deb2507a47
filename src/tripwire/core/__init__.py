"""The pure core: signatures, windows, periods, verdicts, budgets, receipts.

Nothing here does I/O, reads a clock or the environment, logs, or starts threads; time comes
in as arguments. Nothing here imports from the rest of tripwire.
"""
