package vmi

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/qvirt/qvirt/api/v1alpha1"
	"github.com/qvirt/qvirt/launcher/podlayout"
)

// Image pinning. The launcher pod mounts the kernelBoot and containerDisk images by the spec's
// reference, usually a tag; the node resolves the tag when it pulls and reports what it pulled in
// the pod's status (status.containerStatuses[].volumeMounts[].volumeStatus.image.imageRef, with the
// ImageVolumeWithDigest feature). The VMI reconciler copies that into the instance's status
// (RecordImages), and a migration target mounts the recorded digest instead of the tag
// (PinImageVolumes), so both ends of a migration run the same bytes even when the tag has moved.
// A real kubelet of Kubernetes 1.37 under containerd 2 reports nothing there (it matches the
// runtime's mounts to volumes by a name the CRI does not carry); once it does, it will report an
// image ID (the config's digest) rather than a repository digest, which cannot be pulled. Either
// way such a target pulls the tag, and the migration reconciler compares what it got before the
// migration starts (ImageMismatches), where the node reports it.

// podImage is one image volume of a launcher pod, and the instance's image it holds.
type podImage struct {
	volume *corev1.Volume
	// disk is the containerDisk volume's name in spec.volumes; "" for the kernelBoot image.
	disk string
}

// what names the image for a person: "kernelBoot" or "containerDisk <name>".
func (p podImage) what() string {
	if p.disk == "" {
		return "kernelBoot"
	}
	return "containerDisk " + p.disk
}

// podImages finds the image volumes of pod's compute container by where they are mounted: pod
// volume names are positional (containerdisk-<index in spec.volumes>) and stop matching the spec
// once an earlier volume is unplugged, while the mount path carries the instance's volume name.
// The volumes point into pod, so a caller may change them.
func podImages(pod *corev1.Pod) []podImage {
	vols := make(map[string]*corev1.Volume, len(pod.Spec.Volumes))
	for i := range pod.Spec.Volumes {
		if v := &pod.Spec.Volumes[i]; v.Image != nil {
			vols[v.Name] = v
		}
	}
	var out []podImage
	for _, c := range pod.Spec.Containers {
		if c.Name != podlayout.ComputeContainer {
			continue
		}
		for _, m := range c.VolumeMounts {
			v := vols[m.Name]
			if v == nil {
				continue
			}
			if m.MountPath == podlayout.KernelBootDir {
				out = append(out, podImage{volume: v})
			} else if disk, ok := strings.CutPrefix(m.MountPath, podlayout.ContainerDiskDir+"/"); ok && disk != "" {
				out = append(out, podImage{volume: v, disk: disk})
			}
		}
	}
	return out
}

// reportedImageRefs maps the compute container's image volume names to the imageRef the node
// reported for them.
func reportedImageRefs(pod *corev1.Pod) map[string]string {
	out := map[string]string{}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != podlayout.ComputeContainer {
			continue
		}
		for _, m := range cs.VolumeMounts {
			if vs := m.VolumeStatus; vs != nil && vs.Image != nil && vs.Image.ImageRef != "" {
				out[m.Name] = vs.Image.ImageRef
			}
		}
	}
	return out
}

// RecordImages copies what the node reports it pulled for the instance's launcher pod into the
// status. The VMI reconciler is the only writer of these fields, so nothing fights over them; an
// image not reported yet keeps what was recorded. After a migration the target pod is the
// instance's pod, and it reports the digest it was given.
func RecordImages(st *v1alpha1.VirtualMachineInstanceStatus, pod *corev1.Pod) {
	if pod == nil {
		return
	}
	refs := reportedImageRefs(pod)
	for _, img := range podImages(pod) {
		ref := refs[img.volume.Name]
		switch {
		case ref == "":
		case img.disk == "":
			st.KernelBootStatus = &v1alpha1.KernelBootStatus{ImageRef: ref}
		default:
			setContainerDiskRef(st, img.disk, ref)
		}
	}
}

func setContainerDiskRef(st *v1alpha1.VirtualMachineInstanceStatus, disk, ref string) {
	for i := range st.ContainerDiskStatus {
		if st.ContainerDiskStatus[i].Name == disk {
			st.ContainerDiskStatus[i].ImageRef = ref
			return
		}
	}
	st.ContainerDiskStatus = append(st.ContainerDiskStatus, v1alpha1.ContainerDiskStatus{Name: disk, ImageRef: ref})
}

// recordedRef is the imageRef the status records for img, or "".
func recordedRef(st *v1alpha1.VirtualMachineInstanceStatus, img podImage) string {
	if img.disk == "" {
		if st.KernelBootStatus != nil {
			return st.KernelBootStatus.ImageRef
		}
		return ""
	}
	for _, cd := range st.ContainerDiskStatus {
		if cd.Name == img.disk {
			return cd.ImageRef
		}
	}
	return ""
}

// PinImageVolumes points pod's image volumes at the digests st records, pulled IfNotPresent (a
// digest names the same bytes everywhere, so a node's copy is as good as the registry's). The
// migration reconciler calls it on a target pod copied from the source pod. It returns the images
// it left on their tag because st records no pullable digest for them ("kernelBoot",
// "containerDisk <name>"): an instance started before digests were recorded, a node whose runtime
// reports an image ID rather than a repository digest, or one that reports nothing (a real kubelet
// of Kubernetes 1.37 under containerd 2: it matches the runtime's mounts to volumes by a name the
// CRI does not carry). An image the spec names by digest needs no pinning and is not returned.
func PinImageVolumes(pod *corev1.Pod, st *v1alpha1.VirtualMachineInstanceStatus) (unpinned []string) {
	for _, img := range podImages(pod) {
		src := img.volume.Image
		pinned, ok := pinnedReference(src.Reference, recordedRef(st, img))
		if !ok && hasDigest(src.Reference) {
			// The spec names the bytes itself.
			continue
		}
		if !ok {
			unpinned = append(unpinned, img.what())
			continue
		}
		src.Reference, src.PullPolicy = pinned, corev1.PullIfNotPresent
	}
	return unpinned
}

// ImageMismatches compares what target's node reports it pulled with what st records the source
// runs, and names each image whose bytes differ ("containerDisk root: ..."). It is the check for
// an image PinImageVolumes could not pin: a kubelet whose runtime reports an image ID (the
// config's digest, what the CRI's ImageStatus returns; no registry serves it) has its target pull
// the tag, which may have moved since the source pulled it. Two image IDs, or two repository digests, name the
// same bytes exactly when they are equal; a pair of one of each (nodes of different runtimes)
// cannot be compared and is not reported, nor is an image one side has not reported yet.
func ImageMismatches(target *corev1.Pod, st *v1alpha1.VirtualMachineInstanceStatus) []string {
	refs := reportedImageRefs(target)
	var out []string
	for _, img := range podImages(target) {
		recorded, reported := recordedRef(st, img), refs[img.volume.Name]
		a, aKind := imageDigest(recorded)
		b, bKind := imageDigest(reported)
		if a == "" || b == "" || aKind != bKind || a == b {
			continue
		}
		out = append(out, fmt.Sprintf("%s: the target's node pulled %s for %s, the source runs %s",
			img.what(), reported, img.volume.Image.Reference, recorded))
	}
	return out
}

// imageDigest splits what a node reports for an image into its digest and the digest's kind: a
// repository digest ("repo@sha256:<hex>", the manifest's) or an image ID ("sha256:<hex>", the
// config's). Anything else has no digest.
func imageDigest(ref string) (digest string, repoDigest bool) {
	if at := strings.LastIndexByte(ref, '@'); at >= 0 {
		if d := ref[at+1:]; isSHA256Digest(d) {
			return d, true
		}
		return "", false
	}
	if isSHA256Digest(ref) {
		return ref, false
	}
	return "", false
}

// pinnedReference is ref's repository at the digest of imageRef ("repo@sha256:<hex>"). The
// repository is ref's, not imageRef's: it is the one the pod's pull secrets were written for, while
// a node may report a normalised or mirrored name. False when imageRef carries no sha256 digest
// (say a bare image ID, which no registry serves).
func pinnedReference(ref, imageRef string) (string, bool) {
	digest, repoDigest := imageDigest(imageRef)
	if !repoDigest || ref == "" {
		return "", false
	}
	return repository(ref) + "@" + digest, true
}

// hasDigest reports whether an image reference names a sha256 digest ("repo@sha256:<hex>").
func hasDigest(ref string) bool {
	_, repoDigest := imageDigest(ref)
	return repoDigest
}

// repository strips a reference's digest and tag: "host:5000/a/b:tag@sha256:..." is "host:5000/a/b".
func repository(ref string) string {
	if at := strings.IndexByte(ref, '@'); at >= 0 {
		ref = ref[:at]
	}
	if colon := strings.LastIndexByte(ref, ':'); colon > strings.LastIndexByte(ref, '/') {
		ref = ref[:colon]
	}
	return ref
}

func isSHA256Digest(d string) bool {
	hex, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hex) != 64 {
		return false
	}
	for _, c := range hex {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
