"""The consumer side of the SDK: allocation, rebalance, pulling and consuming."""
