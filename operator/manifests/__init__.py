"""The Kubernetes objects the operator applies, built as plain dictionaries by pure code.

Handlers only apply what these functions return and observe the result; every field that
matters is unit-tested (tests/operator/test_manifests.py) and every object is validated
offline against the Kubernetes OpenAPI schemas.
"""
