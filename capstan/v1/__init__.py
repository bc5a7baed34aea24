"""Generated stubs of the capstan.v1 protocol (proto/capstan/v1).

Regenerate with scripts/gen_protos.sh.
"""
