package faultproxy

import (
	"bufio"
	"net"
	"testing"
	"time"
)

func echoServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func roundTrip(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

func TestCutAndRestore(t *testing.T) {
	p, err := Start(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	held, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	p.Cut()
	if err := roundTrip(p.Addr()); err == nil {
		t.Fatal("a round trip went through a cut proxy")
	}
	held.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := held.Read(make([]byte, 1)); err == nil {
		t.Fatal("an open connection survived the cut")
	}
	p.Restore()
	if err := roundTrip(p.Addr()); err != nil {
		t.Fatalf("after restore: %v", err)
	}
}
