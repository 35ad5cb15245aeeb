package launcher

import (
	"github.com/qvirt/qvirt/machine"
)

// The sound card kind: an Intel HD Audio controller (ich9-intel-hda) with a duplex codec, or an
// AC97, a conventional PCI device on pcie.0 (a legacy slot, as the watchdog), whose audio goes to
// QEMU's "none" backend: the node has no sound for it, as KubeVirt's (libvirt's audio type none).
// It is fixed when QEMU starts, so it has only a cold form.

// SoundDeviceID is the -device id of the sound card: "sound-<name>".
func SoundDeviceID(name string) string { return "sound-" + name }

// soundAudiodev is the id of the sound card's audio backend.
const soundAudiodev = "audio-none"

// sound adds the sound card, when the machine has one.
func (b *builder) sound() {
	snd := b.m.Sound
	if snd == nil {
		return
	}
	p := machinePath.Child("sound")
	if !b.unique(p.Child("name"), "sound card", snd.Name) {
		return
	}
	id := SoundDeviceID(snd.Name)
	var devs []string
	switch snd.Model {
	case machine.SoundICH9:
		devs = []string{"-device", "ich9-intel-hda,id=" + id + ",bus=pcie.0,addr=" + b.legacySlot(),
			"-device", "hda-duplex,id=" + id + "-codec0,bus=" + id + ".0,cad=0,audiodev=" + soundAudiodev}
	case machine.SoundAC97:
		devs = []string{"-device", "AC97,id=" + id + ",bus=pcie.0,addr=" + b.legacySlot() + ",audiodev=" + soundAudiodev}
	default:
		b.fail(machine.NotSupported(p.Child("model"), snd.Model, []string{machine.SoundICH9, machine.SoundAC97}))
		return
	}
	b.devs = append(append(b.devs, "-audiodev", "none,id="+soundAudiodev), devs...)
}
