package launcher

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/qvirt/qvirt/internal/atomicfile"
	"github.com/qvirt/qvirt/machine"
)

// DefaultOVMFDir is where Debian's ovmf package installs its builds.
const DefaultOVMFDir = "/usr/share/OVMF"

// EFIVarsFile is the name of an EFI machine's variable store (NVRAM) in the scratch directory, or
// in the state directory when the variables persist (machine.State).
const EFIVarsFile = machine.EFIVarsFile

// OVMFFiles names the OVMF build a machine runs, in Debian's ovmf package: the 4 MiB flash
// layout; for Secure Boot the build that needs SMM, with a variables template that has
// Microsoft's keys enrolled (the keys distributions' shims are signed with) and Secure Boot on.
func OVMFFiles(secureBoot bool) (code, varsTemplate string) {
	if secureBoot {
		return "OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.ms.fd"
	}
	return "OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd"
}

// resolveEFI finds OVMF's code and variables template for efi under OVMFDir and gives the
// machine its own variable store in dir, a copy of the template. An existing store made from the
// same template is kept: the variables the guest wrote last as long as dir, the launcher's
// scratch directory (the instance's life) or the VM's state directory (the VM's). One made from
// the other template (Secure Boot turned on or off since) is made afresh: a store without
// Microsoft's keys would leave a VM that asks for Secure Boot in setup mode, booting anything.
// The guest's boot entries go with it; OVMF then boots the disk's default loader, as a new VM
// does. The template itself is only ever read.
func (h HostResolver) resolveEFI(efi *machine.EFI, dir string) (code, vars string, ferr *machine.FieldError) {
	p := machinePath.Child("firmware", "efi")
	if efi.SecureBoot {
		p = p.Child("secureBoot")
	}
	ovmf := h.OVMFDir
	if ovmf == "" {
		ovmf = DefaultOVMFDir
	}
	codeName, tmplName := OVMFFiles(efi.SecureBoot)
	code, tmpl := filepath.Join(ovmf, codeName), filepath.Join(ovmf, tmplName)
	for _, f := range []string{code, tmpl} {
		if err := regularFile(f); err != nil {
			return "", "", machine.Invalid(p, f, fmt.Sprintf("the OVMF firmware file is missing (%v): install Debian's ovmf package on the node", err))
		}
	}
	vars = filepath.Join(dir, EFIVarsFile)
	if err := varsStore(tmpl, vars); err != nil {
		return "", "", machine.Invalid(p, vars, fmt.Sprintf("create the EFI variable store from %s: %v", tmpl, err))
	}
	return code, vars, nil
}

// varsStore makes the variable store vars from the template tmpl unless it exists already made
// from tmpl. Which template a store was made from is recorded beside it (varsTemplateRecord), by
// the template's name: the two templates are the same size, so the store itself cannot tell. A
// store without a record is an earlier launcher's, kept as it is.
func varsStore(tmpl, vars string) error {
	record, name := vars+varsTemplateRecord, filepath.Base(tmpl)
	made, err := os.ReadFile(record)
	switch {
	case err == nil && string(made) != name:
		if err := os.Remove(vars); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove the store made from %s: %w", made, err)
		}
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return err
	}
	if err := copyOnce(tmpl, vars); err != nil {
		return err
	}
	if string(made) == name {
		return nil
	}
	return atomicfile.WriteDurably(record, 0o600, func(f *os.File) error { _, err := f.WriteString(name); return err })
}

// varsTemplateRecord ends the name of the file that records a variable store's template.
const varsTemplateRecord = ".template"

func regularFile(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	return nil
}

// copyOnce copies src to dst (mode 0600) unless dst exists already with src's size; a dst of
// another size (a store made from another build) is an error, not something to overwrite.
func copyOnce(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	switch have, err := os.Stat(dst); {
	case err == nil && have.Size() == st.Size():
		return nil
	case err == nil:
		return fmt.Errorf("%s exists with %d bytes, the template has %d", dst, have.Size(), st.Size())
	case !errors.Is(err, os.ErrNotExist):
		return err
	}
	return atomicfile.WriteDurably(dst, 0o600, func(f *os.File) error { _, err := io.Copy(f, in); return err })
}
