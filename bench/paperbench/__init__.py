"""The papers' experiments (issue 31) on an HDD model, side by side on five targets:
targets.py (HDD Ext4, fast-disk Ext4, HyCache, JuiceFS, the mergerfs recipe), mover.py (the
recipe's mover), rows.py (the fio rows), postmark.py + pmrow.py (PostMark), report.py
(tables and figures); bench/papers.py is the command."""
