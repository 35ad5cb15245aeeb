package launcher

// The channel device kind: the guest agent's virtio-serial port. QEMU serves its host end on a
// unix socket in RunDir, which only the launcher connects to (agent.go); the guest's qemu-ga opens
// the port named org.qemu.guest_agent.0 (/dev/virtio-ports/org.qemu.guest_agent.0 with udev). It
// is fixed when QEMU starts, so it has only a cold form.

// Guest agent ids: the virtio-serial controller, its port and the port's chardev.
const (
	VirtioSerialID      = "virtio-serial0"
	GuestAgentChardevID = "guest-agent"
	GuestAgentPortID    = "channel-guest-agent"
	// GuestAgentPortName is the port name qemu-ga looks for, as libvirt and KubeVirt name it.
	GuestAgentPortName = "org.qemu.guest_agent.0"
	// The downward metrics port: vhostmd's name, which vm-dump-metrics opens.
	DownwardMetricsChardevID = "downward-metrics"
	DownwardMetricsPortID    = "channel-downward-metrics"
	DownwardMetricsPortName  = "org.github.vhostmd.1"
)

// GuestAgentSocket is the host end of the guest agent's channel.
func (m *Machine) GuestAgentSocket() string { return Dir(m.RunDir).GuestAgent() }

// channels adds the virtio-serial controller on its own root port and the ports on it: the
// guest agent's and the downward metrics'. wait=off: QEMU starts without the launcher connected;
// the guest's writes wait until it is.
func (b *builder) channels() {
	m := b.m
	if !m.GuestAgent && m.DownwardMetrics == nil {
		return
	}
	at := b.virtioSlot("virtio-serial-pci", VirtioSerialID)
	b.devs = append(b.devs, "-device", at.driver+",id="+VirtioSerialID+at.opts())
	if m.GuestAgent {
		b.serialPort(GuestAgentChardevID, GuestAgentPortID, GuestAgentPortName, m.GuestAgentSocket())
	}
	if m.DownwardMetrics != nil {
		b.serialPort(DownwardMetricsChardevID, DownwardMetricsPortID, DownwardMetricsPortName, Dir(m.RunDir).DownwardMetrics())
	}
}

// serialPort adds a virtio-serial port named name whose host end QEMU serves on socket.
func (b *builder) serialPort(chardev, id, name, socket string) {
	b.devs = append(b.devs,
		"-chardev", "socket,id="+chardev+",path="+optEscape(socket)+",server=on,wait=off",
		"-device", "virtserialport,id="+id+",bus="+VirtioSerialID+".0,chardev="+chardev+",name="+name)
}
