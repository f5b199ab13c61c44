"""Turns at a device shared by several model replicas (docs/operations.md, "Sharing a
device"): `table` is the shared state, `order` who goes next, `turns` a replica's client."""
