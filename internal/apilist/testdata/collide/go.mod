module example.com/collide

go 1.24
