module example.com/constrained

go 1.24
