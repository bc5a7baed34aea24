"""What the SDK's consumer groups need from the broker (capstan.v1.Consumer): membership
with change notification, queue locks for orderly consumption, offsets, and send-back."""
