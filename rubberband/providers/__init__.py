"""Compute providers: `local` (Ray nodes on this machine) and `aws` (EC2 through boto3), looked up by name in ``base``."""
