package qmp

import "context"

// SetMemoryDeviceRequestedSize asks the virtio-mem device id for size bytes (qom-set of its
// requested-size); the guest plugs or unplugs blocks to reach it and QEMU reports each change
// with EventMemoryDeviceSizeChange.
func (m *Monitor) SetMemoryDeviceRequestedSize(ctx context.Context, id string, size int64) error {
	args := map[string]any{"path": "/machine/peripheral/" + id, "property": "requested-size", "value": size}
	return m.Call(ctx, "qom-set", args, nil)
}

// MemoryDeviceSize is the virtio-mem device id's plugged size in bytes (qom-get of its size).
func (m *Monitor) MemoryDeviceSize(ctx context.Context, id string) (int64, error) {
	var size int64
	err := m.Call(ctx, "qom-get", map[string]string{"path": "/machine/peripheral/" + id, "property": "size"}, &size)
	return size, err
}
