"""Helpers shared by the test files: problem builders and device checks that more than one
family's tests use. Family-specific builders stay beside their tests."""
