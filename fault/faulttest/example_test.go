package faulttest_test

import (
	"errors"
	"fmt"
	"net/http"
	"syscall"

	"github.com/guardrail-go/guardrail/fault/faulttest"
)

func ExampleNewDeadServer() {
	dead, err := faulttest.NewDeadServer()
	if err != nil {
		panic(err)
	}
	defer dead.Close()
	client := &http.Client{Transport: &http.Transport{}}
	_, err = client.Get(dead.URL)
	fmt.Println(errors.Is(err, syscall.ECONNREFUSED))
	// Output:
	// true
}
