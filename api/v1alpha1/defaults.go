package v1alpha1

// DefaultTerminationGracePeriodSeconds is the guest's shutdown time when the instance sets none,
// as in KubeVirt.
const DefaultTerminationGracePeriodSeconds int64 = 180

// TerminationGracePeriodSeconds is the instance's shutdown grace period: its own, else the
// default. The launcher pod's grace period and the launcher's shutdown both derive from it.
func TerminationGracePeriodSeconds(spec *VirtualMachineInstanceSpec) int64 {
	if spec.TerminationGracePeriodSeconds != nil {
		return *spec.TerminationGracePeriodSeconds
	}
	return DefaultTerminationGracePeriodSeconds
}
