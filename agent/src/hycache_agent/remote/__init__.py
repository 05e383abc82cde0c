"""Remote reads: the HCCache-backed read path for files other nodes hold."""
