"""Comparison statistics (``rlvr_measurement_discipline.txt``): detection floors, exact binomial and paired tests,
the two-part rule across seeds. Pure numpy/scipy; no TRL import."""
