/* matmul.c — being written */
