/* gradcheck.c — being written */
