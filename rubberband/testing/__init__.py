"""Test helpers that live with the package: reference implementations and fakes of the ports."""
