package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
)

// DetectAccel picks "kvm" when a hardware KVM module (kvm_intel or kvm_amd) is loaded
// and /dev/kvm opens; anything else (no /dev/kvm, or a paravirtual kvm_pvm that cannot
// run a stock guest kernel) gets "tcg".
func DetectAccel() (accel, reason string) {
	hw := ""
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			hw = m
		}
	}
	if hw == "" {
		if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
			return "tcg", "kvm_pvm (paravirtual KVM) cannot boot a stock kernel"
		}
		return "tcg", "no hardware KVM module loaded"
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg", fmt.Sprintf("%s loaded but /dev/kvm: %v", hw, err)
	}
	f.Close()
	return "kvm", hw
}

// ResolveAccel validates a --accel flag value.
func ResolveAccel(flag string) (accel, reason string, err error) {
	switch flag {
	case "", "auto":
		a, r := DetectAccel()
		return a, r, nil
	case "kvm", "tcg":
		return flag, "forced by --accel", nil
	}
	return "", "", fmt.Errorf("invalid --accel %q: want auto, kvm or tcg", flag)
}

// CPUModel is the CPU model used for an accel; part of every snapshot's key.
func CPUModel(accel string) string {
	if m := os.Getenv("AGENTVM_CPU_MODEL"); m != "" {
		return m
	}
	if accel == "kvm" {
		return "host"
	}
	return "max"
}

var versionRe = regexp.MustCompile(`version (\d+)\.(\d+)\.(\d+)`)

// Version returns QEMU's version string (e.g. "7.2.22") and checks it is at least 7.2,
// the first release with -netdev stream.
func Version(binary string) (string, error) {
	out, err := exec.Command(binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s not usable (%v): install it with: apt-get install qemu-system-x86 qemu-utils", binary, err)
	}
	m := versionRe.FindStringSubmatch(string(out))
	if m == nil {
		return "", fmt.Errorf("cannot parse %s --version output %q", binary, out)
	}
	var maj, min int
	fmt.Sscan(m[1], &maj)
	fmt.Sscan(m[2], &min)
	if maj < 7 || (maj == 7 && min < 2) {
		return "", fmt.Errorf("QEMU %s.%s is too old: agentvm needs 7.2 or newer (-netdev stream, machine %s)", m[1], m[2], MachineType)
	}
	return m[1] + "." + m[2] + "." + m[3], nil
}
