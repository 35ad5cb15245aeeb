package launcher

// The console device kind: the character devices QEMU serves on unix sockets in RunDir, the two
// QMP monitors (the launcher's own and the operator shell's) and the guest's serial console
// (ttyS0). The launcher adds none of them while the guest runs, so they have only a cold form.

// Chardev ids BuildArgv gives, for the supervisor's QMP commands.
const (
	QMPChardevID      = "qmp"
	ShellQMPChardevID = "qmp-shell"
	SerialChardevID   = "serial0"
)

// QMPSocket is the launcher's own QMP control socket.
func (m *Machine) QMPSocket() string { return Dir(m.RunDir).QMP() }

// ShellQMPSocket is the QMP socket for the operator shell.
func (m *Machine) ShellQMPSocket() string { return Dir(m.RunDir).ShellQMP() }

// SerialSocket is the guest's serial console (ttyS0).
func (m *Machine) SerialSocket() string { return Dir(m.RunDir).Serial() }

// consoles adds the QMP monitors and, when asked for, the serial console. wait=off: QEMU starts
// without a client on any of them; the launcher connects to its monitor once QEMU is up.
func (b *builder) consoles() {
	m := b.m
	for _, c := range []struct{ id, path string }{{QMPChardevID, m.QMPSocket()}, {ShellQMPChardevID, m.ShellQMPSocket()}} {
		b.add("-chardev", "socket,id="+c.id+",path="+optEscape(c.path)+",server=on,wait=off",
			"-mon", "chardev="+c.id+",mode=control")
	}
	if m.SerialConsole {
		b.add("-chardev", "socket,id="+SerialChardevID+",path="+optEscape(m.SerialSocket())+",server=on,wait=off",
			"-serial", "chardev:"+SerialChardevID)
	}
}
