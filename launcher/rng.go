package launcher

// The entropy device kind: a virtio-rng PCI device on its own root port, fed by QEMU from the
// host's /dev/urandom (KubeVirt's libvirt backend, model random). It is fixed when QEMU starts,
// so it has only a cold form.

// RNG ids: the backend object and the device.
const (
	RNGBackendID = "rng-urandom"
	RNGDeviceID  = "rng"
)

// rngSource is the host file the backend reads: non-blocking, and in every container.
const rngSource = "/dev/urandom"

// rng adds the entropy device when the machine has one.
func (b *builder) rng() {
	if !b.m.RNG {
		return
	}
	at := b.virtioSlot("virtio-rng-pci", RNGDeviceID)
	b.devs = append(b.devs, "-object", "rng-random,id="+RNGBackendID+",filename="+rngSource,
		"-device", at.driver+",id="+RNGDeviceID+",rng="+RNGBackendID+at.opts())
}
