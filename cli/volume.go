package cli

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/resource"

	subv1 "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	qv1 "github.com/qvirt/qvirt/api/v1alpha1"
)

// volumeFlags are addvolume's flags.
type volumeFlags struct {
	name, hostDisk, hostDiskType, capacity, emptyDisk, serial, bus, cache string
	shared, readOnly                                                      bool
}

func newAddVolume(e *env) *cobra.Command {
	var f volumeFlags
	cmd := &cobra.Command{
		Use:   "addvolume VM --volume-name NAME (--host-disk PATH | --empty-disk SIZE)",
		Short: "Hot-plug a disk into a virtual machine",
		Long: "Add a volume and its disk to the VirtualMachine VM and, while it runs, to its instance:\n" +
			"PUT .../virtualmachines/VM/addvolume. Hotplug supports two sources:\n" +
			"  --host-disk PATH    a raw image file on the node (under the cluster's allowed host paths);\n" +
			"                      --host-disk-type Disk (must exist, the default) or DiskOrCreate with\n" +
			"                      --capacity SIZE; --shared when every node reaches the file\n" +
			"  --empty-disk SIZE   a blank sparse disk living as long as the instance\n" +
			"SIZE is a Kubernetes quantity: 512Mi, 2Gi, 1G or a number of bytes. The disk is on the\n" +
			"virtio bus (--bus), optionally with a --serial the guest sees in /dev/disk/by-id.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.options()
			if err != nil {
				return err
			}
			if _, err := e.action(cmd.Context(), subv1.VirtualMachines, args[0], subv1.AddVolume, opts); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "volume %s was scheduled to be added to VM %s\n", f.name, args[0])
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "volume-name", "", "name of the volume and its disk (required)")
	fl.StringVar(&f.hostDisk, "host-disk", "", "absolute path of a disk image file on the node")
	fl.StringVar(&f.hostDiskType, "host-disk-type", string(qv1.HostDiskExists), "Disk (the file must exist) or DiskOrCreate")
	fl.StringVar(&f.capacity, "capacity", "", "size of a --host-disk created with DiskOrCreate")
	fl.BoolVar(&f.shared, "shared", false, "the --host-disk file is on storage every node reaches (allows migration)")
	fl.StringVar(&f.emptyDisk, "empty-disk", "", "size of a blank disk, such as 1Gi")
	fl.StringVar(&f.serial, "serial", "", "serial number the guest sees")
	fl.StringVar(&f.bus, "bus", string(qv1.DiskBusVirtio), "disk bus (hotplug supports virtio)")
	fl.StringVar(&f.cache, "cache", "", "host cache mode (hotplug supports none)")
	fl.BoolVar(&f.readOnly, "read-only", false, "attach the disk read-only")
	return cmd
}

// options checks the flags and builds the request body; every error names its flag.
func (f *volumeFlags) options() (*subv1.AddVolumeOptions, error) {
	if f.name == "" {
		return nil, errors.New("--volume-name is required")
	}
	if (f.hostDisk == "") == (f.emptyDisk == "") {
		return nil, errors.New("give exactly one of --host-disk PATH and --empty-disk SIZE")
	}
	src := &qv1.VolumeSource{}
	if f.emptyDisk != "" {
		q, err := parseSize(f.emptyDisk)
		if err != nil {
			return nil, fmt.Errorf("--empty-disk: %w", err)
		}
		src.EmptyDisk = &qv1.EmptyDiskSource{Capacity: q}
	} else {
		hd, err := f.hostDiskSource()
		if err != nil {
			return nil, err
		}
		src.HostDisk = hd
	}
	disk := &qv1.Disk{Name: f.name, Serial: f.serial, Cache: qv1.DriverCache(f.cache),
		Disk: &qv1.DiskTarget{Bus: qv1.DiskBus(f.bus), ReadOnly: f.readOnly}}
	return &subv1.AddVolumeOptions{Name: f.name, Disk: disk, VolumeSource: src}, nil
}

func (f *volumeFlags) hostDiskSource() (*qv1.HostDisk, error) {
	if !strings.HasPrefix(f.hostDisk, "/") {
		return nil, fmt.Errorf("--host-disk %q: want an absolute path on the node", f.hostDisk)
	}
	hd := &qv1.HostDisk{Path: f.hostDisk, Type: qv1.HostDiskType(f.hostDiskType)}
	switch hd.Type {
	case qv1.HostDiskExists:
		if f.capacity != "" {
			return nil, errors.New("--capacity needs --host-disk-type DiskOrCreate")
		}
	case qv1.HostDiskExistsOrCreate:
		if f.capacity == "" {
			return nil, errors.New("--host-disk-type DiskOrCreate needs --capacity SIZE")
		}
		q, err := parseSize(f.capacity)
		if err != nil {
			return nil, fmt.Errorf("--capacity: %w", err)
		}
		hd.Capacity = &q
	default:
		return nil, fmt.Errorf("--host-disk-type %q: want Disk or DiskOrCreate", f.hostDiskType)
	}
	if f.shared {
		shared := true
		hd.Shared = &shared
	}
	return hd, nil
}

// parseSize parses a positive whole number of bytes written as a Kubernetes quantity.
func parseSize(s string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(s))
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%q is not a size such as 512Mi, 2Gi or 1000000 (bytes)", s)
	}
	if q.Sign() <= 0 {
		return resource.Quantity{}, fmt.Errorf("%q: a size must be more than 0 bytes", s)
	}
	if _, ok := q.AsInt64(); !ok {
		return resource.Quantity{}, fmt.Errorf("%q is not a whole number of bytes below 8Ei", s)
	}
	return q, nil
}

func newRemoveVolume(e *env) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "removevolume VM --volume-name NAME",
		Short: "Hot-unplug a disk from a virtual machine",
		Long: "Remove the volume NAME and its disk from the VirtualMachine VM and, while it runs, from its\n" +
			"instance: PUT .../virtualmachines/VM/removevolume. Only hot-plugged volumes can be removed.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return errors.New("--volume-name is required")
			}
			if _, err := e.action(cmd.Context(), subv1.VirtualMachines, args[0], subv1.RemoveVolume, &subv1.RemoveVolumeOptions{Name: name}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "volume %s was scheduled to be removed from VM %s\n", name, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "volume-name", "", "name of the volume to remove (required)")
	return cmd
}
