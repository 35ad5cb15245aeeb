package launcher

// The memory balloon: a virtio-balloon PCI device on its own root port with free page reporting,
// so that the pages the guest frees go back to the host, as KubeVirt's (libvirt's memballoon,
// model virtio, freePageReporting on). Nothing inflates it: it is there for the guest to report
// free pages. It is fixed when QEMU starts, so it has only a cold form.

// MemBalloonDeviceID is the balloon's -device id.
const MemBalloonDeviceID = "balloon"

// memBalloon adds the balloon when the machine has one.
func (b *builder) memBalloon() {
	if !b.m.MemBalloon {
		return
	}
	at := b.virtioSlot("virtio-balloon-pci", MemBalloonDeviceID)
	b.devs = append(b.devs, "-device", at.driver+",id="+MemBalloonDeviceID+",free-page-reporting=on"+at.opts())
}
