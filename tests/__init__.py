import os

# Before any test module imports grpc: its fork handlers can kill a child forked while
# other threads are in gRPC calls (PySpark's JVM, a Popen with a preexec_fn); see
# capstan/__init__.py, which does the same for Capstan's own processes.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
