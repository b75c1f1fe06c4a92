"""Run the estimator audits: ``python benchmarks/estimator_audit.py [--only v05] [--quick] [--output_dir DIR]``.

A thin wrapper around the ``trl-ext audit`` command (:mod:`trl_ext.estimators.audit_cli`).
"""

import argparse
import sys

from trl_ext.estimators.audit_cli import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
