package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// cpuTime returns the CPU time (user and system, all threads) pid has used.
func cpuTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseStat(data)
}

// parseStat reads utime and stime from the contents of /proc/<pid>/stat.
// The command name, in parentheses, may hold spaces: fields are counted
// from the last ')'.
func parseStat(data []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", data)
	}
	fields := bytes.Fields(data[i+1:])
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(fields) < 13 {
		return 0, fmt.Errorf("stat %q: too few fields", data)
	}
	var total int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(string(f), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", data, err)
		}
		total += n
	}
	return time.Duration(total) * clockTick, nil
}

// parentOf returns the parent pid in the contents of /proc/<pid>/stat.
func parentOf(data []byte) int {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0
	}
	fields := bytes.Fields(data[i+1:])
	if len(fields) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(string(fields[1]))
	return n
}

// withChildren returns pid and the pids of its children (nginx's workers).
func withChildren(pid int) []int {
	pids := []int{pid}
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err == nil && parentOf(data) == pid {
			if child, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
				pids = append(pids, child)
			}
		}
	}
	return pids
}

// cpuOf returns the CPU time of the processes pids, together.
func cpuOf(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, pid := range pids {
		t, err := cpuTime(pid)
		if err != nil {
			return 0, err
		}
		total += t
	}
	return total, nil
}
