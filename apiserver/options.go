package apiserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	sub "github.com/qvirt/qvirt/api/subresources/v1alpha1"
	"github.com/qvirt/qvirt/api/v1alpha1"
)

// maxBody bounds an action's body; the largest, addvolume, is a few hundred bytes.
const maxBody = 1 << 20

// BadBodyError is a body that does not parse or does not validate; the message names the
// subresource and the field.
type BadBodyError struct {
	Subresource string
	Err         error
}

func (e *BadBodyError) Error() string {
	return fmt.Sprintf("body of virtualmachines/%s: %v", e.Subresource, e.Err)
}

func (e *BadBodyError) Unwrap() error { return e.Err }

// decodeBody parses a JSON body strictly into T: unknown fields and trailing data are refused.
// An empty body is T's zero value (every option is optional except addvolume's and removevolume's).
func decodeBody[T any](subresource string, body []byte) (T, error) {
	var v T
	if len(bytes.TrimSpace(body)) == 0 {
		return v, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return v, &BadBodyError{Subresource: subresource, Err: describeJSONError(err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return v, &BadBodyError{Subresource: subresource, Err: errors.New("trailing data after the JSON object")}
	}
	return v, nil
}

// describeJSONError says which field a decoding error is about.
func describeJSONError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return fmt.Errorf("field %s: a JSON %s is not a valid %s", te.Field, te.Value, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("not valid JSON at byte %d: %v", se.Offset, err)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("not valid JSON: the object is cut short")
	}
	return err
}

// ParseStartOptions parses and checks the body of virtualmachines/start.
func ParseStartOptions(body []byte) (sub.StartOptions, error) {
	return decodeBody[sub.StartOptions](sub.Start, body)
}

// ParseStopOptions parses and checks the body of virtualmachines/stop.
func ParseStopOptions(body []byte) (sub.StopOptions, error) {
	o, err := decodeBody[sub.StopOptions](sub.Stop, body)
	if err == nil {
		err = checkGracePeriod(sub.Stop, o.GracePeriodSeconds, o.Force)
	}
	return o, err
}

// ParseRestartOptions parses and checks the body of virtualmachines/restart.
func ParseRestartOptions(body []byte) (sub.RestartOptions, error) {
	o, err := decodeBody[sub.RestartOptions](sub.Restart, body)
	if err == nil {
		err = checkGracePeriod(sub.Restart, o.GracePeriodSeconds, o.Force)
	}
	return o, err
}

// checkGracePeriod refuses a negative grace period, and one above 0 with force, as kubectl delete
// does: a forced stop is immediate, so the two would contradict each other.
func checkGracePeriod(subresource string, grace *int64, force bool) error {
	p := field.NewPath("gracePeriodSeconds")
	switch {
	case grace == nil:
		return nil
	case *grace < 0:
		return &BadBodyError{Subresource: subresource, Err: field.Invalid(p, *grace, "must be 0 or more seconds")}
	case force && *grace > 0:
		return &BadBodyError{Subresource: subresource, Err: field.Invalid(p, *grace, "must be 0 or unset with force, which stops at once")}
	}
	return nil
}

// ParseMigrateOptions parses and checks the body of virtualmachines/migrate.
func ParseMigrateOptions(body []byte) (sub.MigrateOptions, error) {
	o, err := decodeBody[sub.MigrateOptions](sub.Migrate, body)
	if err != nil {
		return o, err
	}
	for i, v := range o.DryRun {
		if v != metav1.DryRunAll {
			return o, &BadBodyError{Subresource: sub.Migrate, Err: field.NotSupported(field.NewPath("dryRun").Index(i), v, []string{metav1.DryRunAll})}
		}
	}
	return o, nil
}

// ParseAddVolumeOptions parses and checks the body of virtualmachines/addvolume with the rules of
// a hot-plugged disk (a virtio disk backed by a hostDisk or emptyDisk volume). A missing disk is a
// virtio disk; disk.name, when given, must equal name. It returns the volume and disk to add.
func ParseAddVolumeOptions(body []byte) (v1alpha1.Volume, v1alpha1.Disk, error) {
	o, err := decodeBody[sub.AddVolumeOptions](sub.AddVolume, body)
	if err != nil {
		return v1alpha1.Volume{}, v1alpha1.Disk{}, err
	}
	if errs := validateVolumeName(o.Name); len(errs) > 0 {
		return v1alpha1.Volume{}, v1alpha1.Disk{}, &BadBodyError{Subresource: sub.AddVolume, Err: errs.ToAggregate()}
	}
	disk := v1alpha1.Disk{Name: o.Name, Disk: &v1alpha1.DiskTarget{Bus: v1alpha1.DiskBusVirtio}}
	var errs field.ErrorList
	if o.Disk != nil {
		if o.Disk.Name != "" && o.Disk.Name != o.Name {
			errs = append(errs, field.Invalid(field.NewPath("disk", "name"), o.Disk.Name, fmt.Sprintf("must be empty or equal name %q", o.Name)))
		}
		disk = *o.Disk
		disk.Name = o.Name
	}
	vol := v1alpha1.Volume{Name: o.Name}
	if o.VolumeSource == nil {
		errs = append(errs, field.Required(field.NewPath("volumeSource"), "the volume's backing, e.g. {\"emptyDisk\": {\"capacity\": \"1Gi\"}} or {\"hostDisk\": {...}}"))
	} else {
		vol.VolumeSource = *o.VolumeSource
		errs = append(errs, v1alpha1.ValidateHotplugVolume(&vol, field.NewPath("volumeSource"))...)
	}
	errs = append(errs, v1alpha1.ValidateHotplugDisk(&disk, field.NewPath("disk"))...)
	if len(errs) > 0 {
		return vol, disk, &BadBodyError{Subresource: sub.AddVolume, Err: errs.ToAggregate()}
	}
	return vol, disk, nil
}

// ParseRemoveVolumeOptions parses and checks the body of virtualmachines/removevolume.
func ParseRemoveVolumeOptions(body []byte) (sub.RemoveVolumeOptions, error) {
	o, err := decodeBody[sub.RemoveVolumeOptions](sub.RemoveVolume, body)
	if err != nil {
		return o, err
	}
	if errs := validateVolumeName(o.Name); len(errs) > 0 {
		return o, &BadBodyError{Subresource: sub.RemoveVolume, Err: errs.ToAggregate()}
	}
	return o, nil
}

func validateVolumeName(name string) field.ErrorList {
	p := field.NewPath("name")
	if name == "" {
		return field.ErrorList{field.Required(p, "the volume's (and its disk's) name")}
	}
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// hasDryRunAll is true when the options ask for a dry run.
func hasDryRunAll(dryRun []string) bool { return slices.Contains(dryRun, metav1.DryRunAll) }
